"""List and call through the gateway with the `mcp` SDK client; the run records each call."""

from __future__ import annotations

import asyncio

import mcp_types as types
import pytest

from gateway.models import McpSession
from runs import services
from runs.actors import Actor
from runs.models import ExecutionRecord, LedgerEntry, Run
from tests.mcp.conftest import mcp_session
from tests.mcp.scenarios import db, session_run_id
from tests.support.stack import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_list_and_call_echo_over_stdio(live_stack, everything, agent_token) -> None:
    url = f"{live_stack.url}/mcp/everything/"

    async def scenario() -> tuple[dict, str, str]:
        async with mcp_session(
            url,
            agent_token.raw,
            client_info=types.Implementation(name="pytest-agent", version="7.1"),
        ) as session:
            init = await session.initialize()
            assert init.server_info.name == "safestop/everything"
            tools = await session.list_tools()
            by_name = {tool.name: tool for tool in tools.tools}
            result = await session.call_tool("echo", {"message": "hello gateway"})
            summed = await session.call_tool("get-sum", {"a": 2, "b": 40})
            run_id = await session_run_id()
            status = await db(lambda: Run.objects.get(pk=run_id).status)
            return (
                by_name,
                result.content[0].text + "|" + summed.content[0].text,
                run_id + "|" + status,
            )

    by_name, texts, ids = asyncio.run(scenario())
    run_id, status_during = ids.split("|")
    assert by_name["echo"].annotations.read_only_hint is True  # annotations kept
    assert by_name["toggle-simulated-logging"].annotations.read_only_hint is False
    assert texts.split("|")[0] == "Echo: hello gateway"
    assert "42" in texts.split("|")[1]
    assert status_during == "running"  # leased for the session's life
    run = Run.objects.get(pk=run_id)
    assert run.title == "pytest-agent via everything"
    assert run.agent == "agent-1"
    mcp = McpSession.objects.get(run=run)
    assert (mcp.client_name, mcp.client_version, mcp.upstream_name) == (
        "pytest-agent",
        "7.1",
        "everything",
    )
    calls = list(ExecutionRecord.objects.filter(run=run).order_by("id"))
    assert [(c.tool, c.side_effect, c.execution_state) for c in calls] == [
        ("echo", "none", "succeeded"),
        ("get-sum", "none", "succeeded"),
    ]
    assert calls[0].arguments == {"message": "hello gateway"}
    assert "Echo: hello gateway" in calls[0].last_observation
    assert calls[0].tool_call_id.startswith("mcp:")
    # The client closed its session (DELETE): not a stop — the lease is released and the run
    # interrupted.
    wait_until(lambda: Run.objects.get(pk=run_id).status == "interrupted", 10)
    assert McpSession.objects.get(run=run).end_reason == "client_closed"
    actions = list(LedgerEntry.objects.filter(run=run).values_list("action", flat=True))
    assert not [a for a in actions if a.startswith("stop.")]


def test_attach_to_an_existing_run_with_the_header(
    live_stack, everything, agent_token, team
) -> None:
    run = services.run_create(
        team=team, title="nightly report", agent="reporter", actor=Actor.system("t")
    )

    async def scenario() -> str:
        async with mcp_session(
            f"{live_stack.url}/mcp/everything/",
            agent_token.raw,
            headers={"Safestop-Run-Id": run.pk},
        ) as session:
            await session.initialize()
            await session.call_tool("echo", {"message": "on the named run"})
            return await session_run_id()

    assert asyncio.run(scenario()) == run.pk
    record = ExecutionRecord.objects.get(run=run)
    assert record.tool == "echo"
    assert Run.objects.get(pk=run.pk).title == "nightly report"
