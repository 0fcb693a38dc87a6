"""The way out of a stop, an interruption or a suspension: resume (back to pending at a new
epoch) and close (cancelled without resuming) (DESIGN §2). Handoff's own transitions end in
`run_resume_locked` / `run_close_locked` inside their `locked_run`: the handoff is returned to
automation or closed in the same transaction.
"""

from __future__ import annotations

from django.utils import timezone

from runs import frozen, hooks
from runs.actors import Actor
from runs.errors import IllegalTransition, InvalidInput
from runs.models import (
    Checkpoint,
    OutboxItem,
    OutboxStatus,
    Run,
    RunStatus,
    SteeringMessage,
    SteeringStatus,
)
from runs.selectors import resume_blocked_reason, run_dirty_reasons
from runs.services._base import locked_run, run_move
from runs.services.approvals import (
    settle_approved_while_suspended_locked,
    void_waiting_approvals_locked,
)

RESUMABLE_STATUSES = (
    RunStatus.STOPPED_CLEANLY,
    RunStatus.SUSPENDED,
    RunStatus.INTERRUPTED,
    RunStatus.HANDED_OFF,
)


def run_resume(
    *,
    run_id: str,
    actor: Actor,
    checkpoint: str = "",
    carry_over_steering: bool = False,
    note: str = "",
    via: str = "resume",
) -> Run:
    """Back to pending at a new epoch, so no callback of an older round can touch the new one."""
    with locked_run(run_id) as run:
        if run.status not in RESUMABLE_STATUSES:
            raise IllegalTransition.for_run(run, f"a {run.status} run cannot be resumed")
        if run.status == RunStatus.SUSPENDED:
            # A new epoch is a new round: what waited for a reviewer, or was approved and never
            # ran, belongs to the old one (the worker asks again at the new epoch).
            now = timezone.now()
            why = "the run was resumed at a new epoch"
            settle_approved_while_suspended_locked(run, now=now, why=why)
            void_waiting_approvals_locked(run, now=now, why=why, actor=actor)
        reasons = run_dirty_reasons(run)
        if reasons:
            raise IllegalTransition.for_run(run, resume_blocked_reason(run.status, reasons))
        run_resume_locked(
            run,
            actor=actor,
            checkpoint=checkpoint,
            carry_over_steering=carry_over_steering,
            note=note,
            via=via,
        )
    return run


def run_resume_locked(
    run: Run, *, actor: Actor, checkpoint: str, carry_over_steering: bool, note: str, via: str
) -> None:
    if run.status == RunStatus.HANDED_OFF:
        hooks.handoffs_end(run, "returned")
    if run.status == RunStatus.SUSPENDED:
        # Suspension is waiting, not failure: items queued before it go out once the run runs
        # again, so they move to the new epoch with it (interruptions and stops froze theirs:
        # an item below the current epoch is frozen by it, and must stay below).
        OutboxItem.objects.filter(
            run=run, status=OutboxStatus.PENDING, enqueue_epoch__gte=run.stop_epoch
        ).update(enqueue_epoch=run.stop_epoch + 1)
    if checkpoint:
        if not Checkpoint.objects.filter(run=run, label=checkpoint).exists():
            raise InvalidInput(f"no checkpoint {checkpoint!r} on this run", field="checkpoint")
        run.resume_from = checkpoint
    unapplied = SteeringMessage.objects.filter(run=run, status=SteeringStatus.UNAPPLIED_AT_STOP)
    steering = unapplied.update(
        status=SteeringStatus.CARRIED_OVER if carry_over_steering else SteeringStatus.DISCARDED
    )
    run.stop_epoch += 1
    run.stop_reason = ""
    run.stop_requested_by = ""
    run.stop_requested_at = None
    run.stopped_at = None
    run.interruption = {}
    run_move(
        run,
        RunStatus.PENDING,
        actor=actor,
        action=f"run.{via}",
        reason=via,
        payload={
            "resume_from": run.resume_from,
            "steering_carried_over" if carry_over_steering else "steering_discarded": steering,
            "note": note,
        },
        fields=(
            "stop_epoch",
            "resume_from",
            "stop_reason",
            "stop_requested_by",
            "stop_requested_at",
            "stopped_at",
            "interruption",
        ),
    )


def run_close(*, run_id: str, actor: Actor, note: str = "") -> Run:
    """stopped_cleanly | handed_off → cancelled: stopped and closed without resuming."""
    with locked_run(run_id) as run:
        if run.status not in (RunStatus.STOPPED_CLEANLY, RunStatus.HANDED_OFF):
            raise IllegalTransition.for_run(
                run,
                f"a {run.status} run cannot be closed"
                + (
                    " until its unknowns are resolved"
                    if run.status == RunStatus.STOPPED_DIRTY
                    else ""
                ),
            )
        run_close_locked(run, actor=actor, note=note)
    return run


def run_close_locked(run: Run, *, actor: Actor, note: str) -> None:
    if run.status == RunStatus.HANDED_OFF:
        hooks.handoffs_end(run, "closed")
    now = timezone.now()
    run.finished_at = now
    SteeringMessage.objects.filter(run=run, status=SteeringStatus.UNAPPLIED_AT_STOP).update(
        status=SteeringStatus.DISCARDED
    )
    # Frozen ones, relabelled or still frozen by the run's epoch alone.
    OutboxItem.objects.filter(frozen.frozen_of_run_q(run), run=run).update(
        status=OutboxStatus.DISCARDED, updated_at=now
    )
    run_move(
        run,
        RunStatus.CANCELLED,
        actor=actor,
        action="run.closed",
        reason=note[:60],
        payload={"note": note},
        fields=("finished_at",),
    )
