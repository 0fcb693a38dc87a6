"""`/api/v1/mcp/upstreams/`: team admins register upstreams; secrets sealed, never shown again;
URLs only to allowed hosts."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from gateway.models import McpUpstream
from gateway.secrets import unseal
from runs.models import LedgerEntry

pytestmark = pytest.mark.django_db

PATH = "/api/v1/mcp/upstreams/"


def post(client: Client, body: dict, **headers: str):
    return client.post(PATH, data=json.dumps(body), content_type="application/json", **headers)


def stdio_body(**extra: object) -> dict:
    return {
        "team": "acme",
        "name": "everything",
        "transport": "stdio",
        "command": "npx",
        "args": ["mcp-server-everything", "stdio"],
        "env": {"API_KEY": "very-secret-key"},
        **extra,
    }


def test_admin_registers_stdio_upstream_secret_sealed_and_never_shown(client, alice) -> None:
    client.force_login(alice)
    answer = post(client, stdio_body())
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["env_names"] == ["API_KEY"]
    assert body["endpoint"] == "/mcp/everything/"
    assert "very-secret-key" not in answer.content.decode()
    listed = client.get(PATH)
    assert listed.status_code == 200
    assert [u["name"] for u in listed.json()] == ["everything"]
    assert "very-secret-key" not in listed.content.decode()
    row = McpUpstream.objects.get()
    assert "very-secret-key" not in row.env_sealed  # encrypted at rest
    assert unseal(row.env_sealed) == {"API_KEY": "very-secret-key"}
    entry = LedgerEntry.objects.get(action="mcp.upstream_created")
    assert entry.payload["env_names"] == ["API_KEY"]
    assert "very-secret-key" not in json.dumps(entry.payload)


def test_http_upstream_must_be_on_the_allow_list(client, alice, settings) -> None:
    client.force_login(alice)
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["tools.internal:8443"]
    body = {
        "team": "acme",
        "name": "remote",
        "transport": "http",
        "url": "https://evil.example/mcp",
        "headers": {"Authorization": "Bearer upstream-secret"},
    }
    refused = post(client, body)
    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid"
    assert "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in refused.json()["detail"]
    body["url"] = "https://tools.internal:8443/mcp"
    accepted = post(client, body)
    assert accepted.status_code == 201, accepted.content
    assert accepted.json()["header_names"] == ["Authorization"]
    assert "upstream-secret" not in accepted.content.decode()
    assert unseal(McpUpstream.objects.get().headers_sealed) == {
        "Authorization": "Bearer upstream-secret"
    }


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"name": "Has Spaces"}, "name"),
        ({"transport": "carrier-pigeon"}, "transport"),
        ({"command": ""}, "command"),
        ({"env": {"BAD NAME": "x"}}, "env"),
        ({"env": {"OK": "line\nbreak"}}, "env"),
        ({"url": "https://x.example/"}, "url"),
    ],
)
def test_bad_registrations_are_400_with_the_field(client, alice, extra, field) -> None:
    client.force_login(alice)
    answer = post(client, stdio_body(**extra))
    assert answer.status_code == 400, answer.content
    assert answer.json().get("field") == field or field in answer.json()["detail"]
    assert not McpUpstream.objects.exists()


def test_duplicate_name_is_refused(client, alice) -> None:
    client.force_login(alice)
    assert post(client, stdio_body()).status_code == 201
    again = post(client, stdio_body())
    assert again.status_code == 400
    assert again.json()["field"] == "name"


def test_only_team_admins_register(client, bob, outsider, reviewer_token, agent_token) -> None:
    client.force_login(bob)  # a reviewer of acme
    assert post(client, stdio_body()).status_code == 403
    client.logout()
    assert post(client, stdio_body(), **reviewer_token.header).status_code == 403
    assert post(client, stdio_body(), **agent_token.header).status_code == 403
    client.force_login(outsider)  # admin of another team: acme does not exist for them
    assert post(client, stdio_body()).status_code == 404
    assert not McpUpstream.objects.exists()


def test_delete_is_for_the_teams_admins(client, alice, outsider) -> None:
    client.force_login(alice)
    upstream_id = post(client, stdio_body()).json()["id"]
    client.force_login(outsider)
    assert client.delete(f"{PATH}{upstream_id}/").status_code == 404
    client.force_login(alice)
    assert client.delete(f"{PATH}{upstream_id}/").status_code == 204
    assert not McpUpstream.objects.exists()
    assert LedgerEntry.objects.filter(action="mcp.upstream_deleted").count() == 1
