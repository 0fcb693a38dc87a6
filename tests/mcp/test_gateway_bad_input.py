"""Bad input at `/mcp/<name>/`: clear JSON-RPC errors, nothing across teams, never a 500."""

from __future__ import annotations

import httpx
import pytest

from gateway.models import McpSession
from runs.models import Run
from tests.mcp.scenarios import ACCEPT, INITIALIZE, headers
from tests.support.stack import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def error_of(answer: httpx.Response) -> dict:
    body = answer.json()
    assert body["jsonrpc"] == "2.0"
    return body["error"]


def test_bad_input_is_a_json_rpc_error(
    live_stack, everything, agent_token, outsider_token, settings
) -> None:
    url = f"{live_stack.url}/mcp/everything/"
    with httpx.Client(timeout=30) as http:
        opened = http.post(url, json=INITIALIZE, headers=headers(agent_token))
        assert opened.status_code == 200, opened.text
        assert opened.json()["result"]["protocolVersion"] == "2025-06-18"
        session_id = opened.headers["mcp-session-id"]
        own = headers(agent_token, session_id)

        malformed = http.post(url, content=b"{not json", headers=own)
        assert (malformed.status_code, error_of(malformed)["code"]) == (400, -32700)

        batch = http.post(url, json=[{"jsonrpc": "2.0", "id": 2, "method": "ping"}], headers=own)
        assert (batch.status_code, error_of(batch)["code"]) == (400, -32600)

        not_rpc = http.post(url, json={"id": 3, "method": "ping"}, headers=own)
        assert (not_rpc.status_code, error_of(not_rpc)["code"]) == (400, -32600)

        bad_id = http.post(
            url, json={"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}, headers=own
        )
        assert (bad_id.status_code, error_of(bad_id)["code"]) == (400, -32600)

        unknown = http.post(
            url, json={"jsonrpc": "2.0", "id": 4, "method": "tools/destroy"}, headers=own
        )
        assert error_of(unknown)["code"] == -32601
        assert unknown.json()["id"] == 4

        bad_params = http.post(
            url,
            json={"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"arguments": 7}},
            headers=own,
        )
        assert error_of(bad_params)["code"] == -32602

        huge = http.post(
            url,
            json={
                "jsonrpc": "2.0",
                "id": 6,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"message": "x" * 1_100_000}},
            },
            headers=own,
        )
        assert (huge.status_code, error_of(huge)["code"]) == (413, -32600)

        no_session = http.post(
            url, json={"jsonrpc": "2.0", "id": 7, "method": "ping"}, headers=headers(agent_token)
        )
        assert (no_session.status_code, error_of(no_session)["code"]) == (400, -32600)

        # Another team's token with this team's session id: exactly like an unknown session.
        stolen = http.post(
            url,
            json={"jsonrpc": "2.0", "id": 8, "method": "tools/list"},
            headers=headers(outsider_token, session_id),
        )
        unknown_session = http.post(
            url,
            json={"jsonrpc": "2.0", "id": 8, "method": "tools/list"},
            headers=headers(agent_token, "no-such-session"),
        )
        assert stolen.status_code == unknown_session.status_code == 404
        assert error_of(stolen)["message"] == error_of(unknown_session)["message"]
        assert "echo" not in stolen.text

        # Another team's token cannot reach this team's upstream either.
        other = http.post(url, json=INITIALIZE, headers=headers(outsider_token))
        assert other.status_code == 404
        assert "no upstream named 'everything'" in error_of(other)["message"]

        no_token = http.post(url, json=INITIALIZE, headers=ACCEPT)
        assert no_token.status_code == 401
        assert error_of(no_token)["code"] == -32600

        wrong_path = http.post(
            f"{live_stack.url}/mcp/Bad Name/", json=INITIALIZE, headers=headers(agent_token)
        )
        assert wrong_path.status_code == 404

        put = http.put(url, headers=own)
        assert put.status_code == 405
        # The session's own stream: not for another team's token, not without a session.
        stolen_stream = http.get(url, headers=headers(outsider_token, session_id))
        assert stolen_stream.status_code == 404
        assert http.get(url, headers=headers(agent_token)).status_code == 400

        notification = http.post(
            url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=own
        )
        assert notification.status_code == 202

        # The session survived all of it.
        listed = http.post(
            url, json={"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, headers=own
        )
        assert "echo" in [tool["name"] for tool in listed.json()["result"]["tools"]]

        ended = http.delete(url, headers=own)
        assert ended.status_code == 200
        after = http.post(url, json={"jsonrpc": "2.0", "id": 10, "method": "ping"}, headers=own)
        assert after.status_code == 404
    run_id = McpSession.objects.get().run_id
    wait_until(lambda: Run.objects.filter(pk=run_id, status="interrupted").exists(), 10)


def test_attach_to_another_teams_run_is_refused(
    live_stack, everything, agent_token, outsider_token, other_team
) -> None:
    from runs import services
    from runs.actors import Actor

    foreign = services.run_create(
        team=other_team, title="theirs", agent="x", actor=Actor.system("t")
    )
    url = f"{live_stack.url}/mcp/everything/"
    answer = httpx.post(
        url,
        json=INITIALIZE,
        headers={**headers(agent_token), "Safestop-Run-Id": foreign.pk},
        timeout=30,
    )
    assert answer.status_code == 404
    assert "no run" in error_of(answer)["message"]
    assert Run.objects.get(pk=foreign.pk).status == "pending"  # never leased


def test_a_revoked_token_ends_its_sessions_at_once(
    live_stack_redis, everything, agent_token
) -> None:
    from runs.actors import Actor
    from runs.tokens import api_token_revoke

    url = f"{live_stack_redis.url}/mcp/everything/"
    with httpx.Client(timeout=30) as http:
        opened = http.post(url, json=INITIALIZE, headers=headers(agent_token))
        assert opened.status_code == 200, opened.text
        own = headers(agent_token, opened.headers["mcp-session-id"])
        listed = http.post(
            url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=own
        )
        assert listed.status_code == 200
        # The session's later requests skip the token lookup; the revocation's push ends it.
        api_token_revoke(token_id=agent_token.token.pk, actor=Actor.system("test"))
        wait_until(
            lambda: (
                http.post(
                    url, json={"jsonrpc": "2.0", "id": 3, "method": "ping"}, headers=own
                ).status_code
                == 401
            ),
            10,
            what="the revoked token's session to end",
        )
    wait_until(
        lambda: McpSession.objects.filter(end_reason="token_revoked").exists(), 10, what="the end"
    )
    session = McpSession.objects.get()
    wait_until(lambda: Run.objects.filter(pk=session.run_id, status="interrupted").exists(), 10)


def test_an_upstream_that_does_not_start_is_a_502(live_stack, agent_token, team) -> None:
    from gateway.services import upstream_create
    from runs.actors import Actor

    upstream_create(
        team=team,
        name="broken",
        transport="stdio",
        command="/nonexistent/mcp-server",
        actor=Actor.system("test"),
    )
    answer = httpx.post(
        f"{live_stack.url}/mcp/broken/", json=INITIALIZE, headers=headers(agent_token), timeout=30
    )
    assert answer.status_code == 502
    assert "did not start" in error_of(answer)["message"]
    assert not Run.objects.exists()  # no run for a session that never opened
