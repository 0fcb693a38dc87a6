"""A reviewer's decision about one unknown, applied to the runs records. The `Resolution` record
itself is handoff's: `handoff.services.resolution_record` calls `resolution_apply` inside its
`locked_run` transaction.
"""

from __future__ import annotations

from django.utils import timezone

from runs.actors import Actor
from runs.errors import (
    IllegalTransition,
    NotFound,
)
from runs.ledger import ledger_append
from runs.models import (
    ExecutionRecord,
    Lease,
    OutboxItem,
    OutboxStatus,
    Run,
    RunStatus,
    SideEffectState,
)
from runs.services._base import (
    IN_FLIGHT_OUTBOX,
    run_mark_changed,
)
from runs.services.lifecycle import settle_dirty_if_resolved
from runs.services.outbox import parse_outbox_id

RESOLVABLE_STATUSES = (
    RunStatus.STOPPED_DIRTY,
    RunStatus.STOPPED_CLEANLY,
    RunStatus.INTERRUPTED,
    RunStatus.HANDED_OFF,
)


def resolution_apply(
    run: Run, *, target: str, target_id: str, decision: str, evidence: str, actor: Actor
) -> None:
    """Apply a reviewer's decision to the unknown it names; the caller holds the run lock.

    The record is marked decided (`resolved`: no late fact overwrites a reviewer), the decision
    is ledgered, and a `stopped_dirty` run whose last unknown this was settles clean (and a
    takeover goes on to `handed_off`) in the same transaction.
    """
    _apply_resolution(run, target=target, target_id=target_id, decision=decision)
    ledger_append(
        run=run,
        actor=actor,
        action="resolution.recorded",
        reason=decision,
        payload={
            "target": target,
            "id": target_id,
            "decision": decision,
            "evidence": evidence[:500],
        },
    )
    run_mark_changed(run, kind="resolution.recorded")
    settle_dirty_if_resolved(run, actor=actor, now=timezone.now())


def _apply_resolution(run: Run, *, target: str, target_id: str, decision: str) -> None:
    if target == "tool_call":
        record = ExecutionRecord.objects.filter(run=run, tool_call_id=target_id).first()
        if record is None:
            raise NotFound(f"tool call {target_id} is not on run {run.pk}")
        if record.side_effect_state != SideEffectState.PENDING_VERIFICATION:
            raise IllegalTransition.for_run(
                run,
                f"tool call {target_id} has no unconfirmed side effect ({record.side_effect_state})",
            )
        record.side_effect_state = decision
        record.resolved = True
        record.save(update_fields=["side_effect_state", "resolved"])
    elif target == "outbox":
        item = (
            OutboxItem.objects.select_for_update()
            .filter(run=run, pk=parse_outbox_id(target_id))
            .first()
        )
        if item is None:
            raise NotFound(f"outbox item {target_id} is not on run {run.pk}")
        if item.status not in IN_FLIGHT_OUTBOX:
            raise IllegalTransition.for_run(
                run, f"outbox item {target_id} is {item.status}, not in flight or unknown"
            )
        item.status = (
            OutboxStatus.SENT if decision in ("applied", "compensated") else OutboxStatus.FAILED
        )
        item.resolved = True
        item.last_error = f"resolved by reviewer: {decision}"
        item.save(update_fields=["status", "resolved", "last_error", "updated_at"])
    else:
        updated = Lease.objects.filter(run=run, token=target_id, fenced_unconfirmed=True).update(
            fenced_unconfirmed=False
        )
        if not updated:
            raise NotFound(f"no fenced worker lease {target_id} on run {run.pk}")
