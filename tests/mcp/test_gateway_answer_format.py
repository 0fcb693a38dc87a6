"""How a `tools/call` is answered on the wire: plain JSON when nothing had to be sent before the
answer, an SSE stream as soon as something did (here: the upstream's progress notifications).
Both are the streamable-HTTP transport's answers to a POST; the SDK clients read either."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.mcp.conftest import mcp_session
from tests.mcp.scenarios import INITIALIZE, headers

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _events(body: str) -> list[dict]:
    """The JSON messages of an SSE body (comments and blank lines left out)."""
    return [
        json.loads(line.removeprefix("data:").strip())
        for line in body.splitlines()
        if line.startswith("data:")
    ]


def _call(rpc_id: int, name: str, arguments: dict, meta: dict | None = None) -> dict:
    params: dict = {"name": name, "arguments": arguments}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}


def test_a_call_answers_json_unless_something_streams_first(
    live_stack, everything, agent_token
) -> None:
    url = f"{live_stack.url}/mcp/everything/"
    with httpx.Client(timeout=30) as http:
        opened = http.post(url, json=INITIALIZE, headers=headers(agent_token))
        assert opened.status_code == 200, opened.text
        session_id = opened.headers["mcp-session-id"]
        own = headers(agent_token, session_id)
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert http.post(url, json=initialized, headers=own).status_code == 202

        echo = http.post(url, json=_call(2, "echo", {"message": "plain"}), headers=own)
        assert echo.status_code == 200
        assert echo.headers["content-type"] == "application/json"
        assert echo.headers["mcp-session-id"] == session_id
        answer = echo.json()
        assert answer["id"] == 2
        assert answer["result"]["content"][0]["text"] == "Echo: plain"

        slow = http.post(
            url,
            json=_call(
                3,
                "trigger-long-running-operation",
                {"duration": 0.3, "steps": 3},
                meta={"progressToken": "p-1"},
            ),
            headers=own,
        )
        assert slow.status_code == 200
        assert slow.headers["content-type"] == "text/event-stream", slow.text
        assert slow.headers["mcp-session-id"] == session_id
        messages = _events(slow.text)
        progress = [m for m in messages if m.get("method") == "notifications/progress"]
        assert [m["params"]["progress"] for m in progress] == [1, 2, 3]
        assert all(m["params"]["progressToken"] == "p-1" for m in progress)
        assert messages[-1]["id"] == 3 and "result" in messages[-1]
        assert messages.index(progress[-1]) < len(messages) - 1


def test_the_sdk_client_hears_the_upstreams_progress(live_stack, everything, agent_token) -> None:
    """Through the gateway, as from the upstream itself: a progress callback is called for each
    step, before the result (the SDK gives `_meta` as a dict in mcp 2.x)."""
    url = f"{live_stack.url}/mcp/everything/"
    heard: list[tuple[float, float | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((value, total))

    async def scenario() -> str:
        async with mcp_session(url, agent_token.raw) as session:
            await session.initialize()
            # Twice: the first call of a session waits for its permit, the next read goes
            # beside it (its progress is kept until the permit is granted).
            texts = []
            for _ in range(2):
                result = await session.call_tool(
                    "trigger-long-running-operation",
                    {"duration": 0.2, "steps": 2},
                    progress_callback=progress,
                )
                texts.append(result.content[0].text)
            return " | ".join(texts)

    text = asyncio.run(scenario())
    assert text.count("Long running operation completed") == 2
    assert heard == [(1.0, 2.0), (2.0, 2.0), (1.0, 2.0), (2.0, 2.0)]
