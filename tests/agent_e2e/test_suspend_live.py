"""A run waiting for a reviewer holds no process (OpenAI Agents SDK, `approval_flow="interrupt"`):
one worker process suspends the run at the SDK's interruption and exits; the approval stays
open on the server; a reviewer decides while no process holds the run; a second process goes
on from the saved `RunState` and the approved tool runs exactly once.

Real processes (tests/support/suspending_worker.py) against a live server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runs.models import (
    Approval,
    ApprovalStatus,
    ExecutionRecord,
    ExecutionState,
    Lease,
    Run,
    RunStatus,
)
from tests.support.stack import wait_status

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]


def worker(stack: Any, *args: str) -> subprocess.Popen[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "DATABASE_URL")},
        "SAFESTOP_URL": stack.url,
        "SAFESTOP_TOKEN": stack.agent_raw,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.suspending_worker", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finished(process: subprocess.Popen[str], timeout: float = 60) -> str:
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    return output


def test_the_worker_exits_while_waiting_and_a_second_process_runs_the_approved_tool_once(
    stack, tmp_path
):
    reviewer = stack.reviewer()
    run_id = stack.agent().create_run("Refund, decided later", "sdk-bot")["id"]
    saved, tool_log = tmp_path / "saved.json", tmp_path / "tools.log"

    output = finished(worker(stack, "start", run_id, str(saved), str(tool_log)))
    assert "suspended" in output
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.SUSPENDED
    assert not Lease.objects.filter(run_id=run_id, released_at__isnull=True).exists()
    approval = Approval.objects.get(run_id=run_id)
    assert approval.status == ApprovalStatus.WAITING, "the released lease did not void it"
    assert not tool_log.exists()

    # The second process starts before the decision and waits holding nothing.
    second = worker(stack, "resume", run_id, str(saved), str(tool_log))
    try:
        reviewer.decide_approval(
            approval.public_id, "approve", arguments={"order": "1042", "amount": 90}
        )
    except BaseException:
        second.kill()
        raise
    output = finished(second)
    assert "completed" in output
    assert tool_log.read_text() == "refund 1042 90\n", "ran exactly once, with the edit"
    wait_status(run_id, RunStatus.COMPLETED)
    record = ExecutionRecord.objects.get(run_id=run_id, tool="refund")
    assert record.execution_state == ExecutionState.SUCCEEDED
    assert record.permit_epoch == run.stop_epoch, "the same epoch the approval belongs to"


def test_a_stop_while_suspended_ends_the_run_and_the_waiting_process(stack, tmp_path):
    reviewer = stack.reviewer()
    run_id = stack.agent().create_run("Refund, stopped while suspended", "sdk-bot")["id"]
    saved, tool_log = tmp_path / "saved.json", tmp_path / "tools.log"
    finished(worker(stack, "start", run_id, str(saved), str(tool_log)))
    second = worker(stack, "resume", run_id, str(saved), str(tool_log))
    reviewer.cancel(run_id, "user_stop", note="not needed any more")
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    try:
        output, _ = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode != 0 and "Cancelled" in output, output
    assert Approval.objects.get(run_id=run_id).status == ApprovalStatus.VOID
    assert not tool_log.exists()
