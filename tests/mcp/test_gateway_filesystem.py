"""`@modelcontextprotocol/server-filesystem` behind the gateway: its annotations decide what a
reviewer sees, and a destructive write held for approval runs with the reviewer's edit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runs.actors import Actor
from runs.models import Approval, ExecutionRecord
from runs.services import approval_rule_create
from tests.mcp.conftest import mcp_session
from tests.mcp.scenarios import eventually, reviewer_post, session_run_id

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def waiting_approval() -> Approval | None:
    return Approval.objects.filter(status="waiting").select_related("execution_record").first()


def test_destructive_write_held_then_approved_with_edited_content(
    live_stack, filesystem, shared_dir: Path, agent_token, reviewer_token, team
) -> None:
    approval_rule_create(
        team_id=team.pk,
        actor=Actor.system("test"),
        name="writes need a person",
        side_effect="write",
    )
    target = shared_dir / "config.yaml"
    target.write_text("replicas: 3\n")

    async def scenario() -> tuple[object, object, str]:
        async with mcp_session(f"{live_stack.url}/mcp/files/", agent_token.raw) as session:
            await session.initialize()
            # readOnlyHint true: a read is no side effect, so no rule holds it.
            before = await session.call_tool("read_text_file", {"path": str(target)})
            write = asyncio.create_task(
                session.call_tool("write_file", {"path": str(target), "content": "replicas: 0\n"})
            )
            approval = await eventually(waiting_approval, "the held write's approval")
            assert not write.done()
            assert target.read_text() == "replicas: 3\n"  # held: the upstream saw nothing yet
            answer = await reviewer_post(
                live_stack.url,
                reviewer_token,
                f"/api/v1/approvals/{approval.pk}/decide/",
                {
                    "decision": "approve",
                    "message": "scale down, not off",
                    "arguments": {"path": str(target), "content": "replicas: 1\n"},
                },
            )
            assert answer.status_code == 200, answer.text
            return before, await write, await session_run_id()

    before, written, run_id = asyncio.run(scenario())
    assert before.is_error is False
    assert before.content[0].text == "replicas: 3\n"
    assert written.is_error is False
    assert target.read_text() == "replicas: 1\n"  # the reviewer's content, not the model's
    read = ExecutionRecord.objects.get(run_id=run_id, tool="read_text_file")
    assert (read.side_effect, read.execution_state) == ("none", "succeeded")
    record = ExecutionRecord.objects.get(run_id=run_id, tool="write_file")
    assert (record.side_effect, record.execution_state) == ("write", "succeeded")
    approval = Approval.objects.get(execution_record=record)
    assert approval.original_arguments["content"] == "replicas: 0\n"
    assert approval.arguments["content"] == "replicas: 1\n"


def test_a_path_outside_the_allowed_directory_is_the_upstreams_tool_error(
    live_stack, filesystem, shared_dir: Path, agent_token, tmp_path: Path
) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("keys")

    async def scenario() -> object:
        async with mcp_session(f"{live_stack.url}/mcp/files/", agent_token.raw) as session:
            await session.initialize()
            return await session.call_tool("read_text_file", {"path": str(outside)})

    result = asyncio.run(scenario())
    assert result.is_error is True
    assert "outside allowed directories" in result.content[0].text.lower()
    record = ExecutionRecord.objects.get(tool="read_text_file")
    assert record.execution_state == "failed"
