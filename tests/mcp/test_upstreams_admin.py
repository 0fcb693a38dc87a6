"""The Django admin registers upstreams through the same service: validated, sealed, ledgered."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from gateway.models import McpUpstream
from gateway.secrets import unseal
from runs.models import LedgerEntry

pytestmark = pytest.mark.django_db

ADD = "/admin/gateway/mcpupstream/add/"


@pytest.fixture
def staff(client):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return user


def form(team, **extra: str) -> dict[str, str]:
    return {
        "team": str(team.pk),
        "name": "everything",
        "transport": "stdio",
        "command": "npx",
        "args_json": '["@modelcontextprotocol/server-everything", "stdio"]',
        "env_json": '{"API_KEY": "admin-secret"}',
        "url": "",
        "headers_json": "",
        **extra,
    }


def test_admin_adds_an_upstream_through_the_service(client, staff, team) -> None:
    answer = client.post(ADD, form(team))
    assert answer.status_code == 302, answer.content.decode()[:2000]
    upstream = McpUpstream.objects.get()
    assert upstream.args == ["@modelcontextprotocol/server-everything", "stdio"]
    assert unseal(upstream.env_sealed) == {"API_KEY": "admin-secret"}
    assert LedgerEntry.objects.filter(action="mcp.upstream_created").count() == 1
    page = client.get(f"/admin/gateway/mcpupstream/{upstream.pk}/change/").content.decode()
    assert "API_KEY" in page and "admin-secret" not in page


def test_admin_bad_input_is_a_form_error(client, staff, team) -> None:
    answer = client.post(ADD, form(team, env_json='{"BAD NAME": "x"}'))
    assert answer.status_code == 200
    assert "not a valid name" in answer.content.decode()
    answer = client.post(ADD, form(team, args_json="not json"))
    assert answer.status_code == 200
    assert "args must be JSON" in answer.content.decode()
    assert not McpUpstream.objects.exists()
