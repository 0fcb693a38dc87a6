"""What the upstream asks the client, and what the session's own stream tells it: sampling and
elicitation requests from `server-everything` reach the `mcp` SDK client through the gateway,
and the standalone GET stream carries the notice of a stop."""

from __future__ import annotations

import asyncio
from typing import Any

import mcp_types as types
import pytest

from runs.models import ExecutionRecord
from tests.mcp.conftest import mcp_session
from tests.mcp.scenarios import reviewer_post, session_run_id

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_sampling_request_from_the_upstream_is_answered_by_the_client(
    live_stack, everything, agent_token
) -> None:
    asked: list[types.CreateMessageRequestParams] = []

    async def sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        asked.append(params)
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text="forty-two"),
            model="scripted-model",
        )

    async def scenario() -> types.CallToolResult:
        async with mcp_session(
            f"{live_stack.url}/mcp/everything/", agent_token.raw, sampling_callback=sample
        ) as session:
            await session.initialize()
            tools = {tool.name for tool in (await session.list_tools()).tools}
            # server-everything offers the tool only to a client that declared sampling: the
            # gateway declared it upstream because this client did.
            assert "trigger-sampling-request" in tools
            return await session.call_tool("trigger-sampling-request", {"prompt": "life"})

    result = asyncio.run(scenario())
    assert result.is_error is False
    assert "forty-two" in result.content[0].text
    assert "scripted-model" in result.content[0].text
    (params,) = asked
    assert "life" in params.messages[0].content.text
    record = ExecutionRecord.objects.get()
    assert (record.tool, record.execution_state) == ("trigger-sampling-request", "succeeded")


def test_an_elicitation_from_the_upstream_is_answered_by_the_client(
    live_stack, everything, agent_token
) -> None:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> Any:
        return types.ElicitResult(action="accept", content={"name": "Ada Lovelace"})

    async def scenario() -> types.CallToolResult:
        async with mcp_session(
            f"{live_stack.url}/mcp/everything/", agent_token.raw, elicitation_callback=elicit
        ) as session:
            await session.initialize()
            return await session.call_tool("trigger-elicitation-request", {})

    result = asyncio.run(scenario())
    text = "\n".join(block.text for block in result.content if block.type == "text")
    assert "User provided the requested information" in text
    assert "Ada Lovelace" in text


def test_a_client_without_sampling_is_not_offered_the_upstreams_sampling_tool(
    live_stack, everything, agent_token
) -> None:
    async def scenario() -> set[str]:
        async with mcp_session(f"{live_stack.url}/mcp/everything/", agent_token.raw) as session:
            await session.initialize()
            return {tool.name for tool in (await session.list_tools()).tools}

    tools = asyncio.run(scenario())
    assert "echo" in tools
    assert "trigger-sampling-request" not in tools


def test_the_sessions_stream_tells_an_idle_client_of_a_stop(
    live_stack, everything, agent_token, reviewer_token
) -> None:
    heard: list[types.LoggingMessageNotificationParams] = []

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(params)

    async def scenario() -> types.CallToolResult:
        async with mcp_session(
            f"{live_stack.url}/mcp/everything/", agent_token.raw, logging_callback=log
        ) as session:
            await session.initialize()
            await session.call_tool("echo", {"message": "before"})
            run_id = await session_run_id()
            stop = await reviewer_post(
                live_stack.url,
                reviewer_token,
                f"/api/v1/runs/{run_id}/cancel/",
                {"reason": "user_stop", "note": "wrong customer"},
            )
            assert stop.status_code == 202, stop.text
            # No call is in flight: the only way the client hears of it is its GET stream.
            for _ in range(600):
                if any(p.logger == "safestop" for p in heard):
                    break
                await asyncio.sleep(0.05)
            return await session.call_tool("echo", {"message": "after"})

    after = asyncio.run(scenario())
    notices = [p for p in heard if p.logger == "safestop"]
    assert len(notices) == 1
    assert notices[0].level == "warning"
    assert "stopped by reviewer-bot (reason: user_stop): wrong customer" in notices[0].data
    assert after.is_error is True
    assert "stopped by reviewer-bot" in after.content[0].text
