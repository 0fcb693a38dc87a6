"""Approvals (DESIGN §10) with `safestop_agent` against a live server over real HTTP and
websockets: a tool call waits in `run.tool_call(..., needs_approval=True)`, a reviewer token
decides through `POST /api/v1/approvals/{id}/decide/` (or stops the run), and the worker hears
it on its push socket.

The worker runs in a thread of this process (`WorkerThread`); the server is daphne serving the
whole application on the test database, with its in-memory channel layer, so every push starts
from a change made through the server's HTTP API.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from runs.models import Approval, ExecutionRecord, ExecutionState, RunStatus, SideEffectState
from safestop_agent import AgentRun, ApiError, ApprovalRejected, Cancelled, SafestopClient
from tests.support.stack import (
    WorkerThread,
    actions,
    leased,
    planned,
    wait_status,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {
    "type": "object",
    "properties": {
        "amount_cents": {"type": "integer", "minimum": 1},
        "currency": {"type": "string", "enum": ["EUR", "USD"]},
        "memo": {"type": "string"},
    },
    "required": ["amount_cents", "currency"],
    "additionalProperties": False,
}


def _waiting(reviewer: SafestopClient, run_id: str) -> dict[str, Any]:
    """The run's one waiting approval, as a reviewer token lists it (then reads it whole: a
    list summarises the arguments)."""

    def listed() -> dict[str, Any] | None:
        rows = reviewer.list_approvals(status="waiting", run=run_id)
        return dict(reviewer.get_approval(rows[0]["id"])) if len(rows) == 1 else None

    return wait_until(listed, timeout=10, interval=0.05, what=f"an approval waiting on {run_id}")


def _pay(run: AgentRun, ran: list[dict[str, Any]], *, tool_call_id: str) -> None:
    """The agent's payment tool: it waits for a reviewer, then runs with the final arguments."""
    with run.tool_call(
        "pay_invoice",
        {"amount_cents": 120_000, "currency": "EUR"},
        side_effect="write",
        tool_call_id=tool_call_id,
        needs_approval=True,
        summary="Pay invoice INV-77 to ACME",
        risk="high",
        arguments_schema=SCHEMA,
    ) as call:
        ran.append(
            {
                "at": time.monotonic(),
                "arguments": call.arguments,
                "original": call.original_arguments,
                "edited": call.arguments_edited,
            }
        )
        call.result = {"paid": call.arguments["amount_cents"]}


def test_reviewer_approves_with_edits_and_the_body_runs_with_them(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Pay suppliers", "payments-bot", steps=planned(("pay", "tool_write"))
    )["id"]
    ran: list[dict[str, Any]] = []

    def work() -> None:
        with leased(client, run_id) as run:
            with run.step("pay", "Pay the invoice", kind="tool_write"):
                _pay(run, ran, tool_call_id="call_pay")
            run.complete({"paid": True})

    worker = WorkerThread(work)
    worker.start()
    approval = _waiting(reviewer, run_id)
    assert approval["status"] == "waiting" and approval["tool_call_id"] == "call_pay"
    assert approval["original_arguments"] == {"amount_cents": 120_000, "currency": "EUR"}
    assert approval["summary"] == "Pay invoice INV-77 to ACME" and approval["risk"] == "high"
    assert not approval.get("permit_id")
    assert ran == []  # nothing runs while it waits
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_pay")
    assert record.execution_state == ExecutionState.AWAITING_APPROVAL

    edited = {"amount_cents": 60_000, "currency": "EUR", "memo": "first half only"}
    decided = reviewer.decide_approval(
        approval["id"], "approve", message="pay half now", arguments=edited
    )
    assert decided["status"] == "approved" and decided["arguments"] == edited
    assert decided["permit_id"]
    worker.outcome(15)

    assert len(ran) == 1
    assert ran[0]["arguments"] == edited and ran[0]["edited"] is True
    assert ran[0]["original"] == {"amount_cents": 120_000, "currency": "EUR"}
    record.refresh_from_db()
    assert record.execution_state == ExecutionState.SUCCEEDED
    assert record.arguments == edited
    assert record.side_effect_state != SideEffectState.NOT_APPLIED
    stored = Approval.objects.get(pk=int(approval["id"].removeprefix("appr_")))
    assert (stored.status, stored.edited, stored.decided_by) == ("approved", True, "reviewer-bot")
    assert stored.original_arguments == {"amount_cents": 120_000, "currency": "EUR"}
    trail = actions(run_id)
    assert trail.index("approval.requested") < trail.index("approval.approved")
    wait_status(run_id, RunStatus.COMPLETED)


def test_a_rejection_message_reaches_the_caller_and_the_body_never_runs(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("Pay suppliers", "payments-bot")["id"]
    ran: list[dict[str, Any]] = []
    rejections: list[ApprovalRejected] = []

    def work() -> None:
        with leased(client, run_id) as run:
            try:
                _pay(run, ran, tool_call_id="call_pay")
            except ApprovalRejected as rejected:
                rejections.append(rejected)
            run.complete({"paid": False})

    worker = WorkerThread(work)
    worker.start()
    approval = _waiting(reviewer, run_id)
    message = "ACME's bank details changed yesterday: confirm by phone first"
    decided = reviewer.decide_approval(approval["id"], "reject", message=message)
    assert decided["status"] == "rejected" and not decided.get("permit_id")
    worker.outcome(15)

    assert ran == []
    [rejected] = rejections
    assert rejected.status == "rejected" and rejected.message == message
    assert message in str(rejected)
    assert rejected.approval_id == approval["id"]
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_pay")
    assert record.execution_state == ExecutionState.NOT_STARTED
    assert record.side_effect_state == SideEffectState.NOT_APPLIED
    stored = Approval.objects.get(pk=int(approval["id"].removeprefix("appr_")))
    assert (stored.status, stored.message) == ("rejected", message)
    assert "approval.rejected" in actions(run_id)
    wait_status(run_id, RunStatus.COMPLETED)


def test_a_stop_during_the_wait_raises_cancelled_and_the_body_never_runs(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("Pay suppliers", "payments-bot")["id"]
    ran: list[dict[str, Any]] = []
    seen: list[BaseException] = []
    runs: list[AgentRun] = []

    def work() -> None:
        with leased(client, run_id, into=runs) as run:
            try:
                _pay(run, ran, tool_call_id="call_pay")
            except BaseException as error:  # what the caller sees, then the block obeys it
                seen.append(error)
                raise

    worker = WorkerThread(work)
    worker.start()
    approval = _waiting(reviewer, run_id)
    reviewer.cancel(run_id, "user_stop", note="stop before the payment")
    worker.outcome(15)  # the block swallowed its own Cancelled: a normal way out

    assert ran == []
    assert len(seen) == 1 and isinstance(seen[0], Cancelled), seen
    assert seen[0].reason == "user_stop" and seen[0].stop_epoch == 2
    assert runs[0].token.cancelled
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_pay")
    assert record.execution_state == ExecutionState.NOT_STARTED
    stored = Approval.objects.get(pk=int(approval["id"].removeprefix("appr_")))
    assert stored.status == "void"
    # A stop never waits for an approval: the worker drained, the run stopped cleanly.
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    assert "approval.voided" in actions(run_id)
    # Approving it now is refused: a void approval permits nothing.
    with pytest.raises(ApiError) as refused:
        reviewer.decide_approval(approval["id"], "approve")
    assert (refused.value.status_code, refused.value.code) == (409, "approval_void")
    record.refresh_from_db()
    assert record.execution_state == ExecutionState.NOT_STARTED


def test_the_decision_arrives_by_push_not_by_polling(stack):
    """The approval's GET is polled only every 60 s here, and the polls are counted."""
    client, reviewer = stack.agent(), stack.reviewer()
    delays: list[float] = []
    for attempt in range(3):
        run_id = client.create_run(f"Push approval {attempt}", "payments-bot")["id"]
        ran: list[dict[str, Any]] = []
        polls: list[str] = []
        waiting = threading.Event()

        def work(
            run_id: str = run_id, ran: Any = ran, polls: Any = polls, waiting: Any = waiting
        ) -> None:
            with leased(client, run_id) as run:
                run.approval_poll_interval = 60.0
                real_wait, real_poll = run.wait_for_approval, run._poll_approval

                def wait(approval_id: str, **kwargs: Any) -> Any:
                    waiting.set()
                    return real_wait(approval_id, **kwargs)

                def poll(approval_id: str) -> Any:
                    polls.append(approval_id)
                    return real_poll(approval_id)

                run.wait_for_approval = wait  # type: ignore[method-assign]
                run._poll_approval = poll  # type: ignore[method-assign]
                _pay(run, ran, tool_call_id="call_pay")
                run.complete({})

        worker = WorkerThread(work)
        worker.start()
        approval = _waiting(reviewer, run_id)
        assert waiting.wait(10)
        sent = time.monotonic()
        reviewer.decide_approval(approval["id"], "approve")
        worker.outcome(30)
        assert len(ran) == 1 and polls == [], polls
        delays.append(ran[0]["at"] - sent)
    print(
        f"\napproval decided (POST /decide/) → tool body starts, by push: "
        f"max {max(delays) * 1000:.1f} ms over {len(delays)} approvals (GET polled every 60 s)"
    )
    # Far below the 60 s poll interval: only the push can have brought the decision.
    assert max(delays) < 10.0
