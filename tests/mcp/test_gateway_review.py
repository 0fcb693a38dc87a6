"""Approval rules, rejections and stops, felt by an MCP client through the gateway."""

from __future__ import annotations

import asyncio

import pytest

from gateway.models import McpSession
from runs.actors import Actor
from runs.models import Approval, ExecutionRecord, LedgerEntry, Run
from runs.services import approval_rule_create
from tests.mcp.conftest import mcp_session
from tests.mcp.scenarios import eventually, reviewer_post, session_run_id
from tests.support.stack import alive, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def waiting_approval() -> Approval | None:
    return Approval.objects.filter(status="waiting").select_related("execution_record").first()


def test_held_call_approved_with_edited_arguments(
    live_stack, everything, agent_token, reviewer_token, team
) -> None:
    approval_rule_create(
        team_id=team.pk, actor=Actor.system("test"), name="echo needs a person", tool_glob="echo"
    )

    async def scenario() -> tuple[str, str]:
        async with mcp_session(f"{live_stack.url}/mcp/everything/", agent_token.raw) as session:
            await session.initialize()
            call = asyncio.create_task(session.call_tool("echo", {"message": "rm -rf /"}))
            approval = await eventually(waiting_approval, "the held call's approval")
            assert not call.done()  # held: nothing reached the upstream yet
            answer = await reviewer_post(
                live_stack.url,
                reviewer_token,
                f"/api/v1/approvals/{approval.pk}/decide/",
                {"decision": "approve", "message": "softer", "arguments": {"message": "ls"}},
            )
            assert answer.status_code == 200, answer.text
            result = await call
            return result.content[0].text, await session_run_id()

    text, run_id = asyncio.run(scenario())
    assert text == "Echo: ls"  # the upstream ran the reviewer's arguments, not the model's
    record = ExecutionRecord.objects.get(run_id=run_id)
    assert record.execution_state == "succeeded"
    approval = Approval.objects.get(execution_record=record)
    assert approval.original_arguments == {"message": "rm -rf /"}
    assert approval.arguments == {"message": "ls"}
    assert approval.decided_by == "reviewer-bot"


def test_rejection_is_a_tool_error_with_the_reviewers_message(
    live_stack, everything, agent_token, reviewer_token, team
) -> None:
    approval_rule_create(
        team_id=team.pk,
        actor=Actor.system("test"),
        name="writes need a person",
        side_effect="write",
    )

    async def scenario() -> tuple[object, object]:
        async with mcp_session(f"{live_stack.url}/mcp/everything/", agent_token.raw) as session:
            await session.initialize()
            # A read passes; a write (readOnlyHint false) is held.
            read = await session.call_tool("echo", {"message": "fine"})
            call = asyncio.create_task(session.call_tool("toggle-simulated-logging", {}))
            approval = await eventually(waiting_approval, "the held write's approval")
            answer = await reviewer_post(
                live_stack.url,
                reviewer_token,
                f"/api/v1/approvals/{approval.pk}/decide/",
                {"decision": "reject", "message": "no logging changes on Fridays"},
            )
            assert answer.status_code == 200, answer.text
            return read, await call

    read, rejected = asyncio.run(scenario())
    assert read.is_error is False
    assert rejected.is_error is True
    assert "no logging changes on Fridays" in rejected.content[0].text
    record = ExecutionRecord.objects.get(tool="toggle-simulated-logging")
    assert (record.side_effect, record.execution_state) == ("write", "not_started")


def test_stop_during_long_running_read_cancels_upstream_and_ends_clean(
    live_stack, everything, agent_token, reviewer_token
) -> None:
    async def scenario() -> tuple[object, object, str]:
        async with mcp_session(f"{live_stack.url}/mcp/everything/", agent_token.raw) as session:
            await session.initialize()
            slow = asyncio.create_task(
                session.call_tool("trigger-long-running-operation", {"duration": 60, "steps": 60})
            )
            run_id = await session_run_id()
            await eventually(
                lambda: ExecutionRecord.objects.filter(run_id=run_id).exists(), "the permit"
            )
            stop = await reviewer_post(
                live_stack.url,
                reviewer_token,
                f"/api/v1/runs/{run_id}/cancel/",
                {"reason": "user_stop", "note": "wrong ticket"},
            )
            assert stop.status_code == 202, stop.text
            cancelled = await asyncio.wait_for(slow, 30)
            after = await session.call_tool("echo", {"message": "still there?"})
            return cancelled, after, run_id

    cancelled, after, run_id = asyncio.run(scenario())
    assert cancelled.is_error is True
    assert "stopped by reviewer-bot (reason: user_stop): wrong ticket" in cancelled.content[0].text
    assert "cancelled at the upstream" in cancelled.content[0].text
    assert after.is_error is True
    assert "stopped by reviewer-bot" in after.content[0].text
    run = wait_until(lambda: Run.objects.filter(pk=run_id, status="stopped_cleanly").first(), 20)
    record = ExecutionRecord.objects.get(run=run)
    # A read with no answer: failed, with the cancel requested upstream — nothing unknown.
    assert (record.execution_state, record.remote_cancel_state) == ("failed", "requested")
    assert not ExecutionRecord.objects.filter(run=run, tool="echo").exists()  # never permitted


def test_stop_during_a_write_cancels_it_upstream_and_ends_dirty(
    live_stack, slow_writer, agent_token, reviewer_token, writer_log
) -> None:
    log = writer_log

    async def scenario() -> tuple[object, str]:
        async with mcp_session(f"{live_stack.url}/mcp/writer/", agent_token.raw) as session:
            await session.initialize()
            deploy = asyncio.create_task(
                session.call_tool("deploy", {"service": "billing", "seconds": 60})
            )
            run_id = await session_run_id()
            await eventually(lambda: "deploy-start billing" in _read(log), "the write to start")
            stop = await reviewer_post(
                live_stack.url,
                reviewer_token,
                f"/api/v1/runs/{run_id}/cancel/",
                {"reason": "user_stop", "note": "freeze"},
            )
            assert stop.status_code == 202, stop.text
            return await asyncio.wait_for(deploy, 30), run_id

    result, run_id = asyncio.run(scenario())
    assert result.is_error is True
    run = wait_until(lambda: Run.objects.filter(pk=run_id, status="stopped_dirty").first(), 20)
    record = ExecutionRecord.objects.get(run=run, tool="deploy")
    assert (record.side_effect, record.execution_state) == ("write", "unknown")
    assert record.remote_cancel_state == "requested"
    packet = run.stop_packets.get()
    unknown = packet.snapshot["unconfirmed_side_effects"]
    assert [item["tool_call_id"] for item in unknown] == [record.tool_call_id]
    # The upstream heard the cancel (its handler was interrupted), and its process group is gone.
    text = wait_until(lambda: "deploy-cancelled billing" in _read(log) and _read(log), 10)
    pid = int(text.split("pid ")[1].split()[0])
    wait_until(lambda: not alive(pid), 15, what="the upstream process to be killed")


def test_upstream_crash_mid_call_stops_the_run_for_dependency_failure(
    live_stack, slow_writer, agent_token
) -> None:
    async def scenario() -> tuple[object, str]:
        async with mcp_session(f"{live_stack.url}/mcp/writer/", agent_token.raw) as session:
            await session.initialize()
            result = await asyncio.wait_for(session.call_tool("crash", {"seconds": 0.2}), 30)
            return result, await session_run_id()

    result, run_id = asyncio.run(scenario())
    assert result.is_error is True
    assert "exited during the call" in result.content[0].text
    run = wait_until(lambda: Run.objects.filter(pk=run_id, status="stopped_dirty").first(), 20)
    assert run.stop_reason == "dependency_failure"
    record = ExecutionRecord.objects.get(run=run, tool="crash")
    assert record.execution_state == "unknown"  # a write whose answer never came


def test_client_disconnect_interrupts_never_stops(live_stack, everything, agent_token) -> None:
    async def scenario() -> str:
        async with mcp_session(f"{live_stack.url}/mcp/everything/", agent_token.raw) as session:
            await session.initialize()
            await session.call_tool("echo", {"message": "one"})
            return await session_run_id()

    run_id = asyncio.run(scenario())
    run = wait_until(lambda: Run.objects.filter(pk=run_id, status="interrupted").first(), 20)
    assert run.stop_reason in ("", None) or run.stop_reason != "user_stop"
    actions = list(LedgerEntry.objects.filter(run=run).values_list("action", flat=True))
    assert not [a for a in actions if a.startswith("stop.")]
    assert McpSession.objects.get(run=run).end_reason == "client_closed"


def _read(path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
