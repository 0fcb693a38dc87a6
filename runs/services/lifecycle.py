"""The stop and what follows it: stop, takeover, acknowledge, drain, settle, fence, hand off, and
the interruption (DESIGN §2; docs/ARCHITECTURE.md, "The flow of a stop"). Resume and close, the
ways out, are `resume.py`.

These call each other under one run lock, so they live together. The handoff app's part that
belongs in the same transaction (the stop packet, opening and ending handoffs) runs through
`runs.hooks`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from runs import hooks, notify, sql
from runs.actors import Actor
from runs.errors import (
    IllegalTransition,
    InvalidInput,
    LeaseRevoked,
    StaleEpoch,
)
from runs.ledger import ChainHead, ledger_append
from runs.models import (
    STOPPABLE_STATUSES,
    STOPPED_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    ExecutionRecord,
    ExecutionState,
    Lease,
    LeaseReleaseReason,
    OutboxItem,
    OutboxStatus,
    Run,
    RunStatus,
    SideEffect,
    SideEffectState,
    Step,
    StepStatus,
    StopReason,
    StopRequest,
)
from runs.selectors import run_dirty_reasons
from runs.services._base import (
    OPEN_EXECUTION_STATES,
    RESULT_STATES,
    TRANSITIONS,
    apply_tool_result,
    current_stop_request,
    lease_found,
    live_lease,
    locked_run,
    release_lease,
    run_mark_changed,
    run_move,
)
from runs.services._stop_sql import (
    FROZEN_COUNT_CAP,
    locked_run_for_ack,
    locked_run_for_drain,
    locked_run_for_stop,
    settle_open_calls,
    write_stop,
)
from runs.services.approvals import (
    settle_approved_while_suspended_locked,
    void_waiting_approvals_locked,
)


@dataclass
class StopOutcome:
    stop_request: StopRequest | None
    created: bool
    already_finished: bool = False
    status: str = ""
    stop_epoch: int = 0


def run_stop(
    *,
    run_id: str,
    reason: str,
    actor: Actor,
    note: str = "",
    takeover: bool = False,
    bulk_id: str = "",
) -> StopOutcome:
    """Record a stop: close the entrance, bump the epoch (which freezes the outbox), signal the
    worker.

    Idempotent: a repeat returns the same StopRequest and writes nothing. A stop that arrives
    after the run finished is answered "already finished", logged, and changes nothing.
    `bulk_id` names the bulk stop this one belongs to (DESIGN §12) in its ledger entry.
    """
    if reason not in StopReason.values:
        raise InvalidInput(f"reason must be one of {', '.join(StopReason.values)}", field="reason")
    takeover = takeover or reason == StopReason.MANUAL_TAKEOVER
    with locked_run_for_stop(run_id) as run:
        now = timezone.now()
        if run.status in TERMINAL_STATUSES:
            ledger_append(
                run=run,
                actor=actor,
                action="stop.ignored",
                reason=reason,
                payload={
                    "status": run.status,
                    "why": "already finished",
                    **({"bulk_id": bulk_id} if bulk_id else {}),
                },
            )
            return StopOutcome(
                None, False, already_finished=True, status=run.status, stop_epoch=run.stop_epoch
            )
        if run.status not in STOPPABLE_STATUSES:
            stop_request = current_stop_request(run)
            if takeover and not stop_request.takeover:
                _upgrade_to_takeover(run, stop_request, actor=actor, now=now)
            return StopOutcome(stop_request, False, status=run.status, stop_epoch=run.stop_epoch)
        stop_request = stop_locked(
            run, reason=reason, note=note, actor=actor, now=now, takeover=takeover, bulk_id=bulk_id
        )
        return StopOutcome(stop_request, True, status=run.status, stop_epoch=run.stop_epoch)


def run_takeover(*, run_id: str, actor: Actor, note: str = "") -> StopOutcome:
    """Take over = a stop with reason manual_takeover that ends in handed_off once clean."""
    with locked_run(run_id) as run:
        if run.status == RunStatus.STOPPED_CLEANLY:
            now = timezone.now()
            stop_request = current_stop_request(run)
            _hand_off_locked(run, stop_request, actor=actor, now=now, note=note)
            return StopOutcome(stop_request, False, status=run.status, stop_epoch=run.stop_epoch)
    return run_stop(
        run_id=run_id, reason=StopReason.MANUAL_TAKEOVER, actor=actor, note=note, takeover=True
    )


def _upgrade_to_takeover(
    run: Run, stop_request: StopRequest, *, actor: Actor, now: datetime
) -> None:
    stop_request.takeover = True
    stop_request.save(update_fields=["takeover"])
    ledger_append(
        run=run,
        actor=actor,
        action="stop.takeover_requested",
        reason=StopReason.MANUAL_TAKEOVER,
        payload={"stop_request_id": stop_request.pk},
    )
    if run.status == RunStatus.STOPPED_CLEANLY:
        _hand_off_locked(run, stop_request, actor=actor, now=now)
    else:
        run_mark_changed(run, kind="stop.takeover_requested")


def stop_locked(
    run: Run,
    *,
    reason: str,
    note: str,
    actor: Actor,
    now: datetime,
    takeover: bool = False,
    bulk_id: str = "",
) -> StopRequest:
    """1. close the entrance and bump the epoch; 2. the new epoch freezes the pending outbox (no
    row is rewritten here: `runs.frozen`; the rows are relabelled later); 3. flag calls in flight;
    4. mark unapplied steering; 5. void waiting approvals (a stop never waits on one: the held
    call never starts, a held item is frozen); 6. ledger + signal on commit; 7. with no live
    lease, drain and settle at once, in this same transaction.

    Steps 1–4 and the reads the rest needs are one statement (`_stop_sql`): a stop's CPU time
    was mostly the ORM compiling nine statements (docs/BENCHMARKS.md)."""
    epoch_before, status_before = run.stop_epoch, run.status
    if RunStatus.CANCEL_REQUESTED not in TRANSITIONS[status_before]:
        raise IllegalTransition.for_run(run, f"a {status_before} run cannot be stopped")
    # Calls approved while the run was suspended for reviewers never started (no lease since).
    settle_approved_while_suspended_locked(run, now=now, why=f"the run was stopped ({reason})")
    run.stop_epoch = epoch_before + 1
    run.stop_reason = reason
    run.stop_requested_by = actor.name
    run.stop_requested_at = now
    run.status = RunStatus.CANCEL_REQUESTED
    run.change_seq += 1  # safe as a Python increment: the run row is locked (`_bump_change_seq`)
    run.updated_at = now
    stop_request = StopRequest(
        run=run,
        requested_by=actor.name,
        actor_kind=actor.kind,
        reason=reason,
        note=note,
        takeover=takeover,
        requested_at=now,
        epoch_before=epoch_before,
        epoch_after=run.stop_epoch,
    )
    written = write_stop(run, stop_request, now=now)
    voided = (
        void_waiting_approvals_locked(
            run, now=now, why=f"the run was stopped ({reason})", actor=actor
        )
        if written.approvals_waiting
        else []
    )
    ledger_append(
        run=run,
        actor=actor,
        action="run.stop_requested",
        reason=reason,
        payload={
            "from": status_before,
            "to": RunStatus.CANCEL_REQUESTED,
            "stop_epoch": run.stop_epoch,
            "stop_request_id": stop_request.pk,
            "epoch_before": epoch_before,
            "note": note,
            # Counted up to a cap, so the commit does not grow with the queue.
            "frozen_outbox": min(written.frozen, FROZEN_COUNT_CAP),
            **({"frozen_outbox_more": True} if written.frozen > FROZEN_COUNT_CAP else {}),
            "approvals_voided": voided,
            "takeover": takeover,
            **({"bulk_id": bulk_id} if bulk_id else {}),
        },
        # Voiding approvals appended entries of its own: the head read before is stale then.
        head=None if voided else written.ledger_head,
    )
    # The worker's signal is published first, then the viewers' change (same commit).
    notify.stop_signal(run, stop_request)
    # `frozen_outbox`: whether a relabel is worth queueing (`runs.tasks`).
    notify.run_changed(run, kind="run.stop_requested", frozen_outbox=written.frozen)
    if written.lease_expires_at is None or written.lease_expires_at <= now:
        _drain_without_live_lease(run, stop_request, now=now)
    return stop_request


def _drain_without_live_lease(run: Run, stop_request: StopRequest, *, now: datetime) -> None:
    """No worker holds a live lease, so none can drain: settle in the stop's transaction."""
    lease = live_lease(run)
    if lease is not None:
        release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
    run_move(
        run,
        RunStatus.DRAINING,
        actor=Actor.system(),
        action="run.draining",
        reason="no_live_lease",
    )
    stop_request.drained_at = now
    stop_request.save(update_fields=["drained_at"])
    settle_locked(run, actor=Actor.system(), now=now)


@dataclass(frozen=True)
class SignalDelivery:
    """A stop signal written to a worker's socket: the stop's epoch, and when (the consumer's
    clock at the write, not the time the row is updated)."""

    stop_epoch: int
    at: datetime


def run_acknowledge_stop(
    *,
    run_id: str,
    actor: Actor,
    via: str = "websocket",
    delivered: SignalDelivery | None = None,
) -> Run:
    """The worker noticed the signal: cancel_requested → draining.

    `delivered`: the signal this socket wrote, recorded here (`signal_delivered_at`) instead of
    in a transaction of its own before the ack — a worker that drains at once sends its
    drained right behind its ack, and that transaction was one more on the ack's way to the run
    lock the drained answer waits for. Recorded whatever the run's state: the ack may come
    after the drained."""
    with locked_run_for_ack(run_id) as opening:
        run = opening.run
        stop_request = opening.stop_request
        delivered_at = _delivery_time(stop_request, delivered)
        if run.status == RunStatus.CANCEL_REQUESTED:
            # The stop request's update, the run's and the ledger entry: one round trip.
            writes = sql.Deferred()
            acknowledge_stop_locked(
                run,
                stop_request or current_stop_request(run),
                actor=actor,
                now=timezone.now(),
                via=via,
                head=opening.ledger_head,
                writes=writes,
                delivered_at=delivered_at,
            )
            writes.send()
        elif stop_request is not None and delivered_at is not None:
            stop_request.signal_delivered_at = delivered_at
            sql.save_fields(stop_request, ("signal_delivered_at",))
    return run


def _delivery_time(
    stop_request: StopRequest | None, delivered: SignalDelivery | None
) -> datetime | None:
    """When `delivered` is news for `stop_request`: the same stop, and earlier than what is
    recorded (a drained that came first records its own time, later than the socket's write)."""
    if delivered is None or stop_request is None:
        return None
    if stop_request.epoch_after != delivered.stop_epoch:
        return None
    recorded = stop_request.signal_delivered_at
    return delivered.at if recorded is None or delivered.at < recorded else None


def acknowledge_stop_locked(
    run: Run,
    stop_request: StopRequest,
    *,
    actor: Actor,
    now: datetime,
    via: str,
    head: ChainHead | None = None,
    writes: sql.Deferred | None = None,
    delivered_at: datetime | None = None,
) -> None:
    """`head`: the run chain's head when the caller has just read it under the same lock.
    `writes`: hold the writes back, for the caller's next round trip (`runs.sql.Deferred`).
    `delivered_at`: when the signal reached the worker, if not recorded yet (else: now)."""
    stop_request.acknowledged_at = now
    stop_request.signal_delivered_at = stop_request.signal_delivered_at or delivered_at or now
    fields = ("acknowledged_at", "signal_delivered_at")
    if writes is None:
        sql.save_fields(stop_request, fields)
    else:
        writes.save_fields(stop_request, fields)
    run_move(
        run,
        RunStatus.DRAINING,
        actor=actor,
        action="run.draining",
        reason="worker_ack",
        payload={"via": via},
        head=head,
        writes=writes,
    )


def stop_signal_delivered(*, run_id: str, stop_epoch: int, at: datetime | None = None) -> None:
    """The push reached a worker's socket: record when (stop-quality: time to the worker), the
    earliest time known. `at`: the time of the write to the socket, when it was a while ago."""
    at = at or timezone.now()
    StopRequest.objects.filter(
        Q(signal_delivered_at__isnull=True) | Q(signal_delivered_at__gt=at),
        run_id=run_id,
        epoch_after=stop_epoch,
    ).update(signal_delivered_at=at)


def run_drained(
    *,
    run_id: str,
    lease_token: str,
    epoch: int,
    actor: Actor,
    observations: list[dict[str, Any]] | None = None,
) -> Run:
    """The worker says it has stopped; its observations are recorded as facts, then settle."""
    with locked_run_for_drain(run_id, lease_token) as opening:
        run = opening.run
        lease = lease_found(run, lease_token, opening.lease)
        if epoch != lease.epoch:
            raise StaleEpoch.for_run(
                run, f"the lease was acquired at epoch {lease.epoch}, not {epoch}"
            )
        if (
            run.status in STOPPED_STATUSES
            or run.status in TERMINAL_STATUSES
            or run.status == RunStatus.HANDED_OFF
        ):
            return run  # a retry after the stop already settled
        if run.status not in STOPPING_STATUSES:
            raise IllegalTransition.for_run(run, f"a {run.status} run has no stop to drain")
        if lease.released_at is not None and lease.fenced_unconfirmed:
            raise LeaseRevoked.for_run(run, "the lease was fenced off")
        drained_locked(
            run,
            lease,
            observations=observations or [],
            actor=actor,
            now=timezone.now(),
            stop_request=opening.stop_request,
            head=opening.ledger_head,
        )
    return run


def drained_locked(
    run: Run,
    lease: Lease,
    *,
    observations: list[dict[str, Any]],
    actor: Actor,
    now: datetime,
    stop_request: StopRequest | None = None,
    head: ChainHead | None = None,
) -> None:
    """`stop_request` and `head` (the ledger's): as the caller has just read them under the
    same lock."""
    if stop_request is None:
        stop_request = current_stop_request(run)
    for observation in observations:
        _apply_drain_observation(run, observation, actor=actor, now=now)
    # Nothing below reads what these write before the settle does: they are held back and sent
    # at the head of the settle's first round trip, which reads after them.
    writes = sql.Deferred()
    stop_request.drained_at = now
    stop_request.drain_observations = observations[:200]
    writes.save_fields(stop_request, ("drained_at", "drain_observations"))
    if lease.released_at is None:
        release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now, writes=writes)
    if run.status == RunStatus.CANCEL_REQUESTED:
        acknowledge_stop_locked(
            run, stop_request, actor=actor, now=now, via="drained", head=head, writes=writes
        )
    settle_locked(run, actor=actor, now=now, stop_request=stop_request, writes=writes)


def _apply_drain_observation(
    run: Run, observation: dict[str, Any], *, actor: Actor, now: datetime
) -> None:
    tool_call_id = str(observation.get("tool_call_id", ""))
    state = str(observation.get("execution_state", ""))
    if not tool_call_id or state not in RESULT_STATES:
        return
    record = ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first()
    if record is None:
        return
    apply_tool_result(
        run,
        record,
        execution_state=state,
        operation_id=str(observation.get("operation_id", "")),
        observation=str(observation.get("observation", ""))[:10_000],
        output_truncated=bool(observation.get("output_truncated", False)),
        remote_cancel_state=str(observation.get("remote_cancel_state", "")),
        source="drain",
        recovery_action=str(observation.get("recovery_action", "")),
        actor=actor,
        now=now,
    )


def run_fence_overdue(*, run_id: str, actor: Actor | None = None) -> bool:
    """Drain watchdog: past SAFESTOP_DRAIN_DEADLINE_SECONDS the worker is fenced, the run dirty."""
    actor = actor or Actor.system("drain-watchdog")
    with locked_run(run_id) as run:
        if run.status not in STOPPING_STATUSES or run.stop_requested_at is None:
            return False
        now = timezone.now()
        deadline = run.stop_requested_at + timedelta(
            seconds=settings.SAFESTOP_DRAIN_DEADLINE_SECONDS
        )
        if now < deadline:
            return False
        lease = live_lease(run)
        if lease is not None:
            release_lease(lease, reason=LeaseReleaseReason.REVOKED_BY_STOP, now=now, fenced=True)
        settle_locked(run, actor=actor, now=now, forced_dirty_reason=StopReason.DRAIN_DEADLINE)
    return True


def settle_locked(
    run: Run,
    *,
    actor: Actor,
    now: datetime,
    forced_dirty_reason: str = "",
    stop_request: StopRequest | None = None,
    writes: sql.Deferred | None = None,
) -> None:
    """The clean/dirty decision, then the stop packet (and the handoff for a takeover).

    1. calls still permitted/running never reported: `unknown` (never assumed failed);
    2. the lease is released, or revoked and fenced;
    3. dirty if anything is unknown: a write whose outcome is unconfirmed, an outbox item in
       flight or unknown, a worker fenced without confirming, or a forced reason;
    4. the packet is built once for this epoch; a clean takeover ends in handed_off.

    `stop_request`: the run's current one, when the caller has just read it under the same lock.
    `writes`: the caller's writes held back (`runs.sql.Deferred`), sent with the settle's first
    reads. The settle holds its own writes back too, up to the packet's reads: the packet is
    still built inside this transaction from what it wrote (DESIGN §4).
    """
    if stop_request is None:
        stop_request = current_stop_request(run)
    if writes is None:
        writes = sql.Deferred()
    settling = settle_open_calls(run, now=now, after=writes)
    lease = settling.lease
    if lease is not None:
        release_lease(
            lease,
            reason=LeaseReleaseReason.REVOKED_BY_STOP,
            now=now,
            fenced=bool(forced_dirty_reason),
            writes=writes,
        )
    if run.status == RunStatus.CANCEL_REQUESTED and not forced_dirty_reason:
        run_move(
            run,
            RunStatus.DRAINING,
            actor=actor,
            action="run.draining",
            reason="settling",
            writes=writes,
        )
    # A lease released here may be fenced (`worker_unconfirmed`): then the reasons read again.
    if lease is None:
        reasons = settling.dirty_reasons
    else:
        writes.send()
        reasons = run_dirty_reasons(run)
    if forced_dirty_reason and forced_dirty_reason not in reasons:
        reasons.insert(0, forced_dirty_reason)
    to = RunStatus.STOPPED_DIRTY if reasons else RunStatus.STOPPED_CLEANLY
    run.stopped_at = now
    stop_request.stopped_at = now
    stop_request.outcome_state = to
    stop_request.dirty_reasons = reasons
    writes.save_fields(stop_request, ("stopped_at", "outcome_state", "dirty_reasons"))
    run_move(
        run,
        to,
        actor=actor,
        action=f"run.{to}",
        reason=forced_dirty_reason or run.stop_reason,
        payload={"dirty_reasons": reasons, "stop_request_id": stop_request.pk},
        fields=("stopped_at",),
        head=settling.ledger_head,
        writes=writes,
    )
    # The packet's reads go in the round trip of the writes held back, after them.
    packet = hooks.stop_settled(run, stop_request, writes)
    writes.send()  # whatever the packet builder did not send (nothing, as built here)
    if to == RunStatus.STOPPED_CLEANLY and stop_request.takeover:
        _hand_off_locked(run, stop_request, actor=Actor.system(), now=now, packet=packet)


def settle_dirty_if_resolved(run: Run, *, actor: Actor, now: datetime) -> None:
    """stopped_dirty → stopped_cleanly once the last unknown is resolved (by a fact or a human)."""
    if run.status != RunStatus.STOPPED_DIRTY or run_dirty_reasons(run):
        return
    run_move(
        run,
        RunStatus.STOPPED_CLEANLY,
        actor=actor,
        action="run.stopped_cleanly",
        reason="all_unknowns_resolved",
    )
    stop_request = current_stop_request(run)
    stop_request.outcome_state = RunStatus.STOPPED_CLEANLY
    stop_request.save(update_fields=["outcome_state"])
    if stop_request.takeover:
        _hand_off_locked(run, stop_request, actor=actor, now=now)


def _hand_off_locked(
    run: Run,
    stop_request: StopRequest,
    *,
    actor: Actor,
    now: datetime,
    note: str = "",
    packet: Any = None,
) -> None:
    opened = hooks.hand_off(run, stop_request, actor=actor, note=note, packet=packet)
    run_move(
        run,
        RunStatus.HANDED_OFF,
        actor=actor,
        action="run.handed_off",
        reason=StopReason.MANUAL_TAKEOVER,
        payload={
            "handoff_id": opened.handoff_id,
            "assignee": opened.assignee,
            "accepted": opened.accepted,
        },
    )


def interrupt_locked(
    run: Run,
    *,
    reason: str,
    actor: Actor,
    now: datetime,
    detail: str = "",
    lease_already_closed: bool = False,
) -> None:
    lease = live_lease(run)
    if lease is not None and not lease_already_closed:
        release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
    in_flight = list(
        ExecutionRecord.objects.filter(run=run, execution_state__in=OPEN_EXECUTION_STATES)
    )
    _mark_outcomes_unknown(in_flight, now=now, source="interruption")
    # A lost worker cannot run an approved call: what was waiting is void, never started.
    void_waiting_approvals_locked(
        run, now=now, why=f"the run was interrupted ({reason})", actor=actor
    )
    # An interruption is a failure: what the worker queued is not sent on anyone's say-so but a
    # reviewer's (release), and a later resume (new epoch) cannot strand it as `pending`.
    frozen_count = _freeze_outbox(run, now=now)
    # Claimed before the interruption, outcome not reported: an unknown a person resolves (the
    # interruption packet lists these with the calls above; resume waits for them).
    outbox_in_flight = [
        f"outbox_{pk}"  # OutboxItem.public_id
        for pk in OutboxItem.objects.filter(run=run)
        .unconfirmed()
        .order_by("id")
        .values_list("pk", flat=True)
    ]
    current = Step.objects.filter(run=run, status=StepStatus.RUNNING).order_by("-seq").first()
    run.interruption = {
        "reason": reason,
        "detail": detail,
        "at": now.isoformat(),
        "current_step": {"seq": current.seq, "key": current.key} if current else None,
        "calls_in_flight": [record.tool_call_id for record in in_flight],
        "frozen_outbox": frozen_count,
        "outbox_in_flight": outbox_in_flight,
        "worker_id": lease.worker_id if lease else None,
    }
    run_move(
        run,
        RunStatus.INTERRUPTED,
        actor=actor,
        action="run.interrupted",
        reason=reason,
        payload={
            "calls_in_flight": run.interruption["calls_in_flight"],
            # What a person must check: writes whose outcome is now unknown, and items in flight.
            "writes_in_flight": [
                record.tool_call_id
                for record in in_flight
                if record.side_effect == SideEffect.WRITE
            ],
            "outbox_in_flight": outbox_in_flight,
        },
        fields=("interruption",),
    )


def _mark_outcomes_unknown(records: list[ExecutionRecord], *, now: datetime, source: str) -> None:
    """Calls whose result never arrived are `unknown` — never retried, never assumed failed."""
    for record in records:
        record.execution_state = ExecutionState.UNKNOWN
        record.observed_at = now
        record.observation_source = source
        if record.side_effect == SideEffect.WRITE:
            record.side_effect_state = SideEffectState.PENDING_VERIFICATION
        record.save(
            update_fields=[
                "execution_state",
                "observed_at",
                "observation_source",
                "side_effect_state",
            ]
        )


def _freeze_outbox(run: Run, *, now: datetime) -> int:
    """Freeze the run's pending items at its current epoch (an interruption bumps no epoch, so
    it relabels them itself; older ones an earlier stop froze already); returns how many.
    Called under the run lock, which every enqueue also takes, so no item can slip in between.
    One set-based UPDATE, not a read of every id followed by an UPDATE with a 1,000-element IN
    list (docs/BENCHMARKS.md)."""
    return OutboxItem.objects.filter(
        run=run, status=OutboxStatus.PENDING, enqueue_epoch__gte=run.stop_epoch
    ).update(
        status=OutboxStatus.FROZEN, frozen_at=now, frozen_by_epoch=run.stop_epoch, updated_at=now
    )
