"""The MCP upstreams page: team admins register, edit and delete; everyone else reads; a
secret is taken in and never shown again."""

from __future__ import annotations

import pytest

from gateway.models import McpUpstream
from gateway.secrets import unseal
from gateway.services import upstream_create
from runs.actors import Actor
from runs.models import LedgerEntry

pytestmark = pytest.mark.django_db

PAGE = "/upstreams/"


def _post(**overrides: str) -> dict[str, str]:
    return {
        "team": "acme",
        "name": "everything",
        "transport": "stdio",
        "command": "npx",
        "args": "@modelcontextprotocol/server-everything\nstdio\n",
        "env": "API_KEY=s3cret-value-42\n",
        "url": "",
        "headers": "",
        **overrides,
    }


@pytest.fixture
def registered(team) -> McpUpstream:
    return upstream_create(
        team=team,
        name="files",
        transport="stdio",
        command="node",
        args=["server.js"],
        env={"TOKEN": "keep-me-secret"},
        actor=Actor.system("test"),
    )


def test_an_admin_registers_a_stdio_upstream_and_its_secret_is_not_shown(as_admin, team):
    team.slug = "acme"
    team.save()
    response = as_admin.post(PAGE, _post())
    assert response.status_code == 302, response.content.decode()[:2000]
    upstream = McpUpstream.objects.get(name="everything")
    assert upstream.args == ["@modelcontextprotocol/server-everything", "stdio"]
    assert unseal(upstream.env_sealed) == {"API_KEY": "s3cret-value-42"}
    body = as_admin.get(PAGE).content.decode()
    assert "/mcp/everything/" in body
    assert "API_KEY" in body
    assert "s3cret-value-42" not in body
    assert "s3cret-value-42" not in as_admin.get(f"{PAGE}{upstream.pk}/").content.decode()
    assert LedgerEntry.objects.filter(action="mcp.upstream_created").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"name": "Bad Name"}, "lowercase letters"),
        ({"command": ""}, "command is required"),
        ({"env": "no separator here"}, "every line is NAME=value"),
        (
            {"transport": "http", "command": "", "args": "", "env": "", "url": "http://evil.test/"},
            "SAFESTOP_WEBHOOK_ALLOWED_HOSTS",
        ),
    ],
)
def test_bad_input_is_a_form_message(as_admin, team, overrides, message):
    team.slug = "acme"
    team.save()
    response = as_admin.post(PAGE, _post(**overrides))
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not McpUpstream.objects.exists()


def test_an_edit_keeps_the_secret_unless_new_values_are_typed(as_admin, registered):
    url = f"{PAGE}{registered.pk}/"
    form = as_admin.get(url).content.decode()
    assert "keep-me-secret" not in form
    assert "TOKEN" in form
    answer = as_admin.post(url, {"command": "node", "args": "server.js\n--verbose", "env": ""})
    assert answer.status_code == 302
    registered.refresh_from_db()
    assert registered.args == ["server.js", "--verbose"]
    assert registered.enabled is False  # the box was not ticked
    assert unseal(registered.env_sealed) == {"TOKEN": "keep-me-secret"}
    as_admin.post(
        url, {"command": "node", "args": "server.js", "env": "TOKEN=new", "enabled": "on"}
    )
    registered.refresh_from_db()
    assert unseal(registered.env_sealed) == {"TOKEN": "new"}
    assert registered.enabled is True
    updates = LedgerEntry.objects.filter(action="mcp.upstream_updated").order_by("id")
    assert [entry.payload["secrets_replaced"] for entry in updates] == [[], ["env"]]
    assert "keep-me-secret" not in str([entry.payload for entry in updates])


def test_an_admin_deletes_an_upstream(as_admin, registered):
    answer = as_admin.post(f"{PAGE}{registered.pk}/delete/")
    assert answer.status_code == 302
    assert not McpUpstream.objects.exists()
    assert LedgerEntry.objects.filter(action="mcp.upstream_deleted").exists()


def test_reviewers_and_viewers_read_but_cannot_write(as_reviewer, as_viewer, registered):
    for client in (as_reviewer, as_viewer):
        body = client.get(PAGE).content.decode()
        assert "/mcp/files/" in body
        assert "keep-me-secret" not in body
        assert 'name="command"' not in body  # no form
        assert client.post(PAGE, _post(team=registered.team.slug)).status_code == 403
        assert client.get(f"{PAGE}{registered.pk}/").status_code == 403
        assert client.post(f"{PAGE}{registered.pk}/delete/").status_code == 403
    assert McpUpstream.objects.get().pk == registered.pk


def test_another_teams_upstream_is_not_found(as_outsider, registered):
    assert "/mcp/files/" not in as_outsider.get(PAGE).content.decode()
    assert as_outsider.get(f"{PAGE}{registered.pk}/").status_code == 404
    assert as_outsider.post(f"{PAGE}{registered.pk}/delete/").status_code == 404
    assert McpUpstream.objects.filter(pk=registered.pk).exists()
