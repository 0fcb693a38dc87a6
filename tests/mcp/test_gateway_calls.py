"""List and call through the gateway with the `mcp` SDK client; the run records each call."""

from __future__ import annotations

import mcp_types as types
import pytest
from asgiref.sync import sync_to_async

from gateway.models import McpSession
from runs.models import ExecutionRecord, LedgerEntry, Run
from tests.mcp.conftest import mcp_session

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _records(run_id: str) -> list[ExecutionRecord]:
    return list(ExecutionRecord.objects.filter(run_id=run_id).order_by("id"))


async def test_list_and_call_echo_over_stdio(live_stack, everything, agent_token) -> None:
    url = f"{live_stack.url}/mcp/everything/"
    async with mcp_session(
        url, agent_token.raw, client_info=types.Implementation(name="pytest-agent", version="7.1")
    ) as session:
        init = await session.initialize()
        assert init.server_info.name == "safestop/everything"
        tools = await session.list_tools()
        by_name = {tool.name: tool for tool in tools.tools}
        assert by_name["echo"].annotations.read_only_hint is True  # annotations kept
        assert by_name["toggle-simulated-logging"].annotations.read_only_hint is False
        result = await session.call_tool("echo", {"message": "hello gateway"})
        assert result.content[0].text == "Echo: hello gateway"
        summed = await session.call_tool("get-sum", {"a": 2, "b": 40})
        assert "42" in summed.content[0].text

        mcp = await sync_to_async(McpSession.objects.get)()
        run = await sync_to_async(Run.objects.get)(pk=mcp.run_id)
        assert run.status == "running"
        assert run.title == "pytest-agent via everything"
        assert run.agent == "agent-1"
        assert (mcp.client_name, mcp.client_version, mcp.upstream_name) == (
            "pytest-agent",
            "7.1",
            "everything",
        )
        calls = await sync_to_async(_records)(run.pk)
        assert [(c.tool, c.side_effect, c.execution_state) for c in calls] == [
            ("echo", "none", "succeeded"),
            ("get-sum", "none", "succeeded"),
        ]
        assert calls[0].arguments == {"message": "hello gateway"}
        assert "Echo: hello gateway" in calls[0].last_observation
        assert calls[0].tool_call_id.startswith("mcp:")
    # The client closed its session (DELETE): not a stop — the run is interrupted, its lease
    # released, and the upstream process is gone.
    run = await sync_to_async(Run.objects.get)(pk=mcp.run_id)
    assert run.status == "interrupted"
    mcp = await sync_to_async(McpSession.objects.get)()
    assert mcp.end_reason == "client_closed"
    actions = await sync_to_async(
        lambda: list(LedgerEntry.objects.filter(run_id=run.pk).values_list("action", flat=True))
    )()
    assert "stop.requested" not in actions
