"""The run page names the MCP client and the upstream of a run opened through the gateway."""

from __future__ import annotations

import pytest

from gateway.services import session_ended, session_opened, upstream_create
from runs import services
from runs.actors import Actor

pytestmark = pytest.mark.django_db


def test_run_page_shows_the_mcp_client_and_upstream(client, alice, team) -> None:
    actor = Actor.system("test")
    upstream = upstream_create(
        team=team, name="everything", transport="stdio", command="node", actor=actor
    )
    run = services.run_create(team=team, title="claude via everything", agent="a", actor=actor)
    session_opened(
        public_id="s-1",
        run_id=run.pk,
        upstream=upstream,
        client_name="claude-code",
        client_version="2.1.0",
        token_name="agent-1",
    )
    client.force_login(alice)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "MCP client" in page
    assert "claude-code" in page and "2.1.0" in page
    assert "/mcp/everything/" in page
    assert "session ended" not in page
    session_ended(public_id="s-1", reason="client_closed")
    assert "session ended (client_closed)" in client.get(f"/runs/{run.pk}/").content.decode()


def test_run_page_of_an_ordinary_run_has_no_mcp_row(client, alice, team) -> None:
    run = services.run_create(team=team, title="t", agent="a", actor=Actor.system("test"))
    client.force_login(alice)
    assert "MCP client" not in client.get(f"/runs/{run.pk}/").content.decode()
