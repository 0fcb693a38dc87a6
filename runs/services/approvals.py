"""Approval decisions (DESIGN §10): approve (as asked or edited), reject, expire, escalate, and
voiding what waits at a stop or an interruption. What holds a call or an item is
`approval_gate.py`.

Requesting, deciding, expiring and voiding all lock the run row first, like a permit and a
stop, so each of them is ordered against the stop: an approval decided before the stop's commit
permits work at the old epoch (which the stop then finds as in-flight work); one decided after
it finds the approval already void. A decision is taken once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from runs import notify
from runs.actors import Actor
from runs.argument_schemas import edited_arguments_check
from runs.errors import (
    AlreadyDecided,
    ApprovalVoid,
    InvalidInput,
    NotFound,
    RunNotRunning,
)
from runs.ledger import ledger_append
from runs.models import (
    Approval,
    ApprovalStatus,
    ApprovalTarget,
    ExecutionRecord,
    ExecutionState,
    OutboxStatus,
    Run,
    RunStatus,
    SideEffect,
    SideEffectState,
)
from runs.services._base import locked_run, run_mark_changed
from runs.services.approval_gate import approval_target_ids

DECISIONS = ("approve", "reject")


# --------------------------------------------------------------------------------------------
# decide, expire, escalate


def parse_approval_id(value: str | int) -> int:
    text = str(value)
    text = text.removeprefix("appr_")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise NotFound(f"approval {value} does not exist")
    return int(text)


def _run_id_of(approval_id: int) -> str:
    run_id = Approval.objects.filter(pk=approval_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"approval appr_{approval_id} does not exist")
    return run_id


def _lock_approval(approval_id: int) -> Approval:
    return (
        Approval.objects.select_for_update(of=("self",))
        .select_related("execution_record", "outbox_item")
        .get(pk=approval_id)
    )


def _refuse_decided(approval: Approval, run: Run) -> None:
    if approval.status == ApprovalStatus.VOID:
        raise ApprovalVoid(
            f"{approval.public_id} was voided: {approval.message or 'the run stopped'}",
            status=run.status,
            stop_epoch=run.stop_epoch,
            approval_status=approval.status,
        )
    raise AlreadyDecided(
        f"{approval.public_id} was already {approval.status}"
        + (f" by {approval.decided_by}" if approval.decided_by else ""),
        status=run.status,
        stop_epoch=run.stop_epoch,
        approval_status=approval.status,
        decided_by=approval.decided_by,
        decided_at=approval.decided_at.isoformat() if approval.decided_at else None,
    )


def _final_arguments(approval: Approval, arguments: Any) -> tuple[dict[str, Any], bool]:
    """The arguments to approve, and whether they were edited (checked by `_check_edits`)."""
    if arguments is None:
        return approval.arguments, False
    return arguments, arguments != approval.original_arguments


def _check_edits(approval_id: int, arguments: Any) -> None:
    """Edited arguments against the approval's schema: bounded, and before the run lock, so a
    stop never waits behind a reviewer's validation. The schema never changes after the
    request, so a check here holds under the lock too."""
    schema, status = (
        Approval.objects.filter(pk=approval_id).values_list("arguments_schema", "status").get()
    )
    if status == ApprovalStatus.WAITING:  # a decided one is answered 409 under the lock
        edited_arguments_check(schema or None, arguments)


def approval_decide(
    *,
    approval_id: int,
    decision: str,
    actor: Actor,
    message: str = "",
    arguments: Any = None,
) -> Approval:
    """A reviewer approves (as is, or with edited arguments) or rejects a waiting approval.

    0. edited arguments are checked first, without a lock (`_check_edits`); 1. lock the run,
    then the approval; 2. a decided approval answers 409 with the first
    decision (void: `approval_void`); 3. approve only while the run is running at the
    approval's epoch; 4. move the held record or item; 5. ledger + push to the worker on commit.
    """
    if decision not in DECISIONS:
        raise InvalidInput(f"decision must be one of {', '.join(DECISIONS)}", field="decision")
    if not isinstance(message, str):
        raise InvalidInput("message must be text", field="message")
    run_id = _run_id_of(approval_id)
    if decision == "approve" and arguments is not None:
        _check_edits(approval_id, arguments)
    with locked_run(run_id) as run:
        approval = _lock_approval(approval_id)
        if approval.status != ApprovalStatus.WAITING:
            _refuse_decided(approval, run)
        now = timezone.now()
        if decision == "approve":
            open_for_decision = run.status == RunStatus.RUNNING or keeps_approvals(run)
            if not open_for_decision or run.stop_epoch != approval.epoch:
                raise RunNotRunning(
                    f"the run is {run.status} at epoch {run.stop_epoch}; "
                    f"{approval.public_id} belongs to epoch {approval.epoch}",
                    status=run.status,
                    stop_epoch=run.stop_epoch,
                )
            final, edited = _final_arguments(approval, arguments)
            _approve_locked(
                run, approval, final=final, edited=edited, actor=actor, now=now, message=message
            )
        else:
            if arguments is not None:
                raise InvalidInput(
                    "a rejection carries a message, not arguments", field="arguments"
                )
            _deny_locked(
                run, approval, ApprovalStatus.REJECTED, actor=actor, now=now, message=message
            )
    return approval


def _stamp(approval: Approval, status: str, *, actor: Actor, now: datetime, message: str) -> None:
    approval.status = status
    approval.decided_by = actor.name
    approval.decided_by_kind = actor.kind
    approval.decided_at = now
    approval.message = message[:4000]


def _approve_locked(
    run: Run,
    approval: Approval,
    *,
    final: dict[str, Any],
    edited: bool,
    actor: Actor,
    now: datetime,
    message: str,
) -> None:
    _stamp(approval, ApprovalStatus.APPROVED, actor=actor, now=now, message=message)
    approval.arguments = final
    approval.edited = edited
    approval.save(
        update_fields=[
            "status",
            "decided_by",
            "decided_by_kind",
            "decided_at",
            "message",
            "arguments",
            "edited",
        ]
    )
    if approval.target == ApprovalTarget.TOOL_CALL:
        record = approval.execution_record
        assert record is not None
        record.execution_state = ExecutionState.PERMITTED
        record.permitted_at = now
        record.arguments = final
        if record.side_effect == SideEffect.WRITE:
            # From here the call may run: a write whose result never arrives is unconfirmed.
            record.side_effect_state = SideEffectState.PENDING_VERIFICATION
        record.save(
            update_fields=["execution_state", "permitted_at", "arguments", "side_effect_state"]
        )
    else:
        item = approval.outbox_item
        assert item is not None
        item.status = OutboxStatus.PENDING
        item.payload = final
        item.save(update_fields=["status", "payload", "updated_at"])
    payload: dict[str, Any] = {
        "approval_id": approval.public_id,
        "edited": edited,
        **approval_target_ids(approval),
    }
    if edited:
        payload["original_arguments"] = approval.original_arguments
        payload["arguments"] = final
    ledger_append(
        run=run, actor=actor, action="approval.approved", reason=message[:60], payload=payload
    )
    run_mark_changed(run, kind="approval.approved")
    notify.approval_decided(run, approval)


def _deny_locked(
    run: Run, approval: Approval, status: str, *, actor: Actor, now: datetime, message: str
) -> None:
    """Rejected or expired: the call never runs (not_started), the item is discarded."""
    _stamp(approval, status, actor=actor, now=now, message=message)
    approval.save(
        update_fields=["status", "decided_by", "decided_by_kind", "decided_at", "message"]
    )
    if approval.target == ApprovalTarget.TOOL_CALL:
        _never_ran(approval.execution_record, now=now, why=f"approval {status}")
    else:
        item = approval.outbox_item
        assert item is not None
        item.status = OutboxStatus.DISCARDED
        item.last_error = f"approval {status}: {message}"[:1000]
        item.save(update_fields=["status", "last_error", "updated_at"])
    ledger_append(
        run=run,
        actor=actor,
        action=f"approval.{status}",
        reason=message[:60],
        payload={
            "approval_id": approval.public_id,
            "message": message,
            **approval_target_ids(approval),
        },
    )
    run_mark_changed(run, kind=f"approval.{status}")
    notify.approval_decided(run, approval)


def _never_ran(record: ExecutionRecord | None, *, now: datetime, why: str) -> None:
    assert record is not None
    record.execution_state = ExecutionState.NOT_STARTED
    record.side_effect_state = (
        SideEffectState.NOT_APPLIED
        if record.side_effect == SideEffect.WRITE
        else SideEffectState.NONE
    )
    record.last_observation = why
    record.observed_at = now
    record.observation_source = "approval"
    record.finished_at = now
    record.save(
        update_fields=[
            "execution_state",
            "side_effect_state",
            "last_observation",
            "observed_at",
            "observation_source",
            "finished_at",
        ]
    )


def approval_expire(*, approval_id: int, now: datetime | None = None) -> bool:
    """Deny by default: a waiting approval past its deadline is expired, as a rejection."""
    with locked_run(_run_id_of(approval_id)) as run:
        approval = _lock_approval(approval_id)
        now = now or timezone.now()
        if approval.status != ApprovalStatus.WAITING or approval.deadline > now:
            return False
        _deny_locked(
            run,
            approval,
            ApprovalStatus.EXPIRED,
            actor=Actor.system("approval-deadline"),
            now=now,
            message="no reviewer decided before the deadline",
        )
    return True


def approval_escalate(*, approval_id: int, now: datetime | None = None) -> bool:
    """Mark a still-waiting approval escalated; the ledger entry is what notifications deliver."""
    with locked_run(_run_id_of(approval_id)) as run:
        approval = _lock_approval(approval_id)
        now = now or timezone.now()
        if (
            approval.status != ApprovalStatus.WAITING
            or approval.escalated_at is not None
            or approval.escalate_at is None
            or approval.escalate_at > now
        ):
            return False
        approval.escalated_at = now
        approval.save(update_fields=["escalated_at"])
        ledger_append(
            run=run,
            actor=Actor.system("approval-escalation"),
            action="approval.escalated",
            payload={
                "approval_id": approval.public_id,
                "deadline": approval.deadline.isoformat(),
                **approval_target_ids(approval),
            },
        )
        run_mark_changed(run, kind="approval.escalated")
    return True


# --------------------------------------------------------------------------------------------
# suspended for a reviewer (a worker released its lease with `suspend`)


def keeps_approvals(run: Run) -> bool:
    """A run its worker suspended to wait for reviewers (`lease_release(suspend=True)`): its
    waiting approvals stay open, are decided while no process holds the run, and the next
    lease (same epoch) picks the decisions up."""
    return run.status == RunStatus.SUSPENDED and bool(
        (run.interruption or {}).get("keeps_approvals")
    )


def settle_approved_while_suspended_locked(run: Run, *, now: datetime, why: str) -> list[str]:
    """The calls approved while the run was suspended for reviewers never ran: no worker held a
    lease since the suspension (a suspension with calls in flight is refused), so when the run
    is stopped or resumed at a new epoch instead of leased again, they are `not_started`, never
    `unknown`. Returns their tool_call_ids."""
    if not keeps_approvals(run):
        return []
    approved = list(
        ExecutionRecord.objects.select_for_update()
        .filter(run=run, execution_state=ExecutionState.PERMITTED)
        .order_by("id")
    )
    for record in approved:
        _never_ran(record, now=now, why=f"approved while suspended, never started: {why}")
    return [record.tool_call_id for record in approved]


# void (called by the stop and the interruption, in their transaction)


def void_waiting_approvals_locked(run: Run, *, now: datetime, why: str, actor: Actor) -> list[str]:
    """A stop never waits on an approval: every waiting one is void, its call never starts,
    its outbox item is frozen with the rest of the outbox."""
    # Most stops find nothing waiting: ask with the cheapest query first (the locking read
    # below, with its joins, cost a stop ~2.5 ms of ORM work for nothing). The run lock held
    # by the caller means no approval can start waiting in between.
    if not Approval.objects.filter(run=run, status=ApprovalStatus.WAITING).exists():
        return []
    waiting = list(
        Approval.objects.select_for_update(of=("self",))
        .select_related("execution_record", "outbox_item")
        .filter(run=run, status=ApprovalStatus.WAITING)
    )
    for approval in waiting:
        _stamp(approval, ApprovalStatus.VOID, actor=actor, now=now, message=why)
        approval.save(
            update_fields=["status", "decided_by", "decided_by_kind", "decided_at", "message"]
        )
        if approval.target == ApprovalTarget.TOOL_CALL:
            _never_ran(approval.execution_record, now=now, why=f"approval void: {why}")
        else:
            item = approval.outbox_item
            assert item is not None
            item.status = OutboxStatus.FROZEN
            item.frozen_at = now
            item.frozen_by_epoch = run.stop_epoch
            item.save(update_fields=["status", "frozen_at", "frozen_by_epoch", "updated_at"])
        ledger_append(
            run=run,
            actor=actor,
            action="approval.voided",
            reason=why[:60],
            payload={"approval_id": approval.public_id, **approval_target_ids(approval)},
        )
        notify.approval_decided(run, approval)
    return [approval.public_id for approval in waiting]
