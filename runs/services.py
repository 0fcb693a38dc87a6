"""Every write to a run and its children: one function per transition of DESIGN §2.

Each public function:
1. opens `transaction.atomic(durable=True)` and locks the run row first (`_lock_run`), so the
   stop, a permit, a dispatch claim and a completion on one run are serialised — there is no
   gap between "checked: still running" and "started the tool";
2. re-checks the status and epoch and raises a typed `runs.errors` error for anything illegal;
3. bumps `stop_epoch` where DESIGN says so (stop, takeover, resume);
4. writes its ledger entry in the same transaction;
5. publishes "run changed" on commit (`runs.notify`), never while the lock is held.

Lock order everywhere: run, then its children (lease, execution records, outbox items).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from runs import notify
from runs.actors import Actor
from runs.errors import (
    IllegalTransition,
    InvalidInput,
    LeaseHeld,
    LeaseRevoked,
    NotFound,
    RunNotRunning,
    StaleEpoch,
)
from runs.ledger import ledger_append
from runs.models import (
    STOPPABLE_STATUSES,
    STOPPED_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    Artifact,
    Checkpoint,
    EventReceipt,
    ExecutionRecord,
    ExecutionState,
    Lease,
    LeaseReleaseReason,
    OutboxItem,
    OutboxStatus,
    RecoveryPolicy,
    RejectedWrite,
    RemoteCancelState,
    Run,
    RunStatus,
    SideEffect,
    SideEffectState,
    SteeringMessage,
    SteeringStatus,
    Step,
    StepKind,
    StepStatus,
    StopReason,
    StopRequest,
    Team,
)

TRANSPORTS = ("webhook", "email")
OPEN_EXECUTION_STATES = (ExecutionState.PERMITTED, ExecutionState.RUNNING)
IN_FLIGHT_OUTBOX = (OutboxStatus.DISPATCHING, OutboxStatus.UNKNOWN)

# DESIGN §2, the legal moves. Anything not listed is refused with `illegal_transition`.
TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.PENDING: frozenset({RunStatus.RUNNING, RunStatus.CANCEL_REQUESTED}),
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            RunStatus.SUSPENDED,
            RunStatus.INTERRUPTED,
            RunStatus.CANCEL_REQUESTED,
        }
    ),
    RunStatus.SUSPENDED: frozenset({RunStatus.PENDING, RunStatus.CANCEL_REQUESTED}),
    RunStatus.INTERRUPTED: frozenset({RunStatus.PENDING, RunStatus.CANCEL_REQUESTED}),
    RunStatus.CANCEL_REQUESTED: frozenset({RunStatus.DRAINING, RunStatus.STOPPED_DIRTY}),
    RunStatus.DRAINING: frozenset({RunStatus.STOPPED_CLEANLY, RunStatus.STOPPED_DIRTY}),
    RunStatus.STOPPED_DIRTY: frozenset({RunStatus.STOPPED_CLEANLY}),
    RunStatus.STOPPED_CLEANLY: frozenset(
        {RunStatus.HANDED_OFF, RunStatus.PENDING, RunStatus.CANCELLED}
    ),
    RunStatus.HANDED_OFF: frozenset({RunStatus.COMPLETED, RunStatus.PENDING, RunStatus.CANCELLED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


# --------------------------------------------------------------------------------------------
# shared mechanics


def _lock_run(run_id: str) -> Run:
    """The first query of every transition: the run row, locked, so transitions serialise."""
    try:
        return (
            Run.objects.select_for_update(no_key=True, of=("self",))
            .select_related("team")
            .get(pk=run_id)
        )
    except Run.DoesNotExist:
        raise NotFound(f"run {run_id} does not exist") from None


def _touch(run: Run, *fields: str) -> None:
    # Safe as a Python increment: every caller holds the run row lock.
    run.change_seq += 1
    run.save(update_fields=[*fields, "change_seq", "updated_at"])


def _move(
    run: Run,
    to: str,
    *,
    actor: Actor,
    action: str,
    reason: str = "",
    payload: dict[str, Any] | None = None,
    fields: tuple[str, ...] = (),
) -> None:
    """Change status (checked against TRANSITIONS), ledger it, and notify on commit."""
    before = run.status
    if to not in TRANSITIONS[before]:
        raise IllegalTransition(
            f"a {before} run cannot move to {to}", status=run.status, stop_epoch=run.stop_epoch
        )
    run.status = to
    _touch(run, "status", *fields)
    ledger_append(
        run=run,
        actor=actor,
        action=action,
        reason=reason,
        payload={"from": before, "to": to, "stop_epoch": run.stop_epoch, **(payload or {})},
    )
    notify.run_changed(run, kind=action)


def _changed(run: Run, *, kind: str, fields: tuple[str, ...] = ()) -> None:
    """A change to the run's children (no status change): bump the sequence and notify."""
    _touch(run, *fields)
    notify.run_changed(run, kind=kind)


def _refuse(
    run: Run, error_cls: type[StaleEpoch] | type[RunNotRunning], detail: str
) -> StaleEpoch | RunNotRunning:
    return error_cls(detail, status=run.status, stop_epoch=run.stop_epoch)


def _record_rejected_write(run: Run, *, kind: str, epoch: int, code: str) -> None:
    """Stale-epoch writes are refused *and counted* (stop-quality figure: late writes)."""
    RejectedWrite.objects.create(
        run=run, kind=kind, epoch=epoch, run_epoch=run.stop_epoch, code=code
    )
    Run.objects.filter(pk=run.pk).update(late_writes_rejected=F("late_writes_rejected") + 1)


def _reject_late_write(
    run_id: str, *, kind: str, epoch: int, error: StaleEpoch | RunNotRunning
) -> None:
    """Count a refused write in its own short transaction, then raise the refusal."""
    if isinstance(error, StaleEpoch):
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
            _record_rejected_write(run, kind=kind, epoch=epoch, code=error.code)
    raise error


def _live_lease(run: Run) -> Lease | None:
    return Lease.objects.filter(run=run, released_at__isnull=True).first()


def _lease_is_current(lease: Lease | None, run: Run, now: Any) -> bool:
    return lease is not None and lease.epoch == run.stop_epoch and lease.expires_at > now


def _check_work_may_start(run: Run, epoch: int, *, now: Any) -> StaleEpoch | RunNotRunning | None:
    """The entrance: only a running run, at its current epoch, with a live current lease."""
    if epoch != run.stop_epoch:
        return _refuse(
            run, StaleEpoch, f"epoch {epoch} is not the run's current epoch {run.stop_epoch}"
        )
    if run.status != RunStatus.RUNNING:
        return _refuse(run, RunNotRunning, f"the run is {run.status}; no new work may start")
    if not _lease_is_current(_live_lease(run), run, now):
        return _refuse(run, RunNotRunning, "the run has no live lease at this epoch")
    return None


def _release_lease(lease: Lease, *, reason: str, now: Any, fenced: bool = False) -> None:
    lease.released_at = now
    lease.release_reason = reason
    lease.fenced_unconfirmed = fenced
    lease.save(update_fields=["released_at", "release_reason", "fenced_unconfirmed"])


# --------------------------------------------------------------------------------------------
# create


@dataclass
class PlannedStep:
    key: str
    name: str = ""
    kind: str = StepKind.MODEL_CALL


def run_create(
    *,
    team: Team,
    title: str,
    agent: str,
    actor: Actor,
    steps: list[PlannedStep] | None = None,
    max_seconds: int | None = None,
    max_tool_calls: int | None = None,
    idempotency_key: str = "",
) -> Run:
    run, _created = run_create_or_get(
        team=team,
        title=title,
        agent=agent,
        actor=actor,
        steps=steps,
        max_seconds=max_seconds,
        max_tool_calls=max_tool_calls,
        idempotency_key=idempotency_key,
    )
    return run


def run_create_or_get(
    *,
    team: Team,
    title: str,
    agent: str,
    actor: Actor,
    steps: list[PlannedStep] | None = None,
    max_seconds: int | None = None,
    max_tool_calls: int | None = None,
    idempotency_key: str = "",
) -> tuple[Run, bool]:
    """Create a run; with an idempotency key, a retry returns the first run (created=False)."""
    if idempotency_key:
        existing = Run.objects.filter(team=team, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic(durable=True):
            run = Run.objects.create(
                team=team,
                title=title,
                agent=agent,
                max_seconds=max_seconds,
                max_tool_calls=max_tool_calls,
                created_by=actor.name,
                idempotency_key=idempotency_key,
            )
            Step.objects.bulk_create(
                Step(run=run, seq=index, key=step.key, name=step.name or step.key, kind=step.kind)
                for index, step in enumerate(steps or [], start=1)
            )
            ledger_append(
                run=run, actor=actor, action="run.created", payload={"title": title, "agent": agent}
            )
            notify.run_changed(run, kind="run.created")
    except IntegrityError:
        # Two concurrent retries with one key: the unique constraint lets one through.
        existing = (
            Run.objects.filter(team=team, idempotency_key=idempotency_key).first()
            if idempotency_key
            else None
        )
        if existing is None:
            raise
        return existing, False
    return run, True


# --------------------------------------------------------------------------------------------
# leases


def lease_acquire(*, run_id: str, worker_id: str, ttl_seconds: float, actor: Actor) -> Lease:
    """pending → running. The lease carries the run's current epoch."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        now = timezone.now()
        lease = _live_lease(run)
        if lease is not None and lease.expires_at > now:
            raise LeaseHeld(
                f"the run is leased by {lease.worker_id} until {lease.expires_at.isoformat()}",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if run.status != RunStatus.PENDING:
            raise RunNotRunning(
                f"a {run.status} run cannot be leased", status=run.status, stop_epoch=run.stop_epoch
            )
        if lease is not None:  # an expired leftover on a pending run: close it before the new one
            _release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
        lease = Lease.objects.create(
            run=run,
            worker_id=worker_id,
            epoch=run.stop_epoch,
            token="lease_" + secrets.token_hex(16),
            acquired_at=now,
            heartbeat_at=now,
            expires_at=now + timedelta(seconds=ttl_seconds),
            ttl_seconds=ttl_seconds,
        )
        if run.started_at is None:
            run.started_at = now
        _move(
            run,
            RunStatus.RUNNING,
            actor=actor,
            action="lease.acquired",
            payload={"worker_id": worker_id, "lease_id": lease.token, "epoch": lease.epoch},
            fields=("started_at",),
        )
    return lease


def _find_lease(run: Run, lease_token: str) -> Lease:
    lease = Lease.objects.filter(run=run, token=lease_token).first()
    if lease is None:
        raise NotFound(f"lease {lease_token} does not belong to run {run.pk}")
    return lease


@dataclass
class HeartbeatAnswer:
    lease: Lease
    signal: dict[str, Any] | None


def lease_heartbeat(*, run_id: str, lease_token: str, epoch: int, actor: Actor) -> HeartbeatAnswer:
    """Renew the lease. After a stop, the answer carries the signal and counts as the ack."""
    expired_run = False
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        lease = _find_lease(run, lease_token)
        now = timezone.now()
        if epoch != lease.epoch:
            raise StaleEpoch(
                f"the lease was acquired at epoch {lease.epoch}, not {epoch}",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if lease.released_at is not None:
            raise LeaseRevoked(
                f"the lease was {lease.release_reason or 'released'}",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if lease.expires_at <= now and run.status == RunStatus.RUNNING:
            # Too late: another worker may be about to take over. Interrupt now rather than
            # let a worker that missed its deadline carry on as if nothing happened.
            _interrupt_locked(
                run, reason=StopReason.LEASE_EXPIRED, actor=Actor.system("lease-reaper"), now=now
            )
            expired_run = True
        else:
            lease.heartbeat_at = now
            lease.expires_at = now + timedelta(seconds=lease.ttl_seconds)
            lease.save(update_fields=["heartbeat_at", "expires_at"])
            signal = None
            if run.status in STOPPING_STATUSES:
                stop_request = _current_stop_request(run)
                signal = notify.signal_payload(stop_request)
                if run.status == RunStatus.CANCEL_REQUESTED:
                    _acknowledge_locked(run, stop_request, actor=actor, now=now, via="heartbeat")
            return HeartbeatAnswer(lease=lease, signal=signal)
    if expired_run:
        raise LeaseRevoked(
            "the lease expired before this heartbeat; the run is interrupted",
            status=RunStatus.INTERRUPTED,
            stop_epoch=run.stop_epoch,
        )
    raise AssertionError("unreachable")


def lease_release(*, run_id: str, lease_token: str, epoch: int, actor: Actor) -> Lease:
    """The worker gives its lease back. During a stop this is a drain with no observations."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        lease = _find_lease(run, lease_token)
        if epoch != lease.epoch:
            raise StaleEpoch(
                f"the lease was acquired at epoch {lease.epoch}, not {epoch}",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if lease.released_at is not None:
            return lease  # releasing twice is a retry, not an error
        now = timezone.now()
        if run.status in STOPPING_STATUSES:
            _drained_locked(run, lease, observations=[], actor=actor, now=now)
            return lease
        _release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
        if run.status == RunStatus.RUNNING and lease.epoch == run.stop_epoch:
            # A running run left without a worker is interrupted, and only a resume (new epoch)
            # lets a worker start again, so the releasing worker is fenced off for good.
            _interrupt_locked(
                run, reason="worker_released", actor=actor, now=now, lease_already_closed=True
            )
        else:
            ledger_append(
                run=run, actor=actor, action="lease.released", payload={"lease_id": lease.token}
            )
            _changed(run, kind="lease.released")
    return lease


def lease_expire(*, lease_id: int, actor: Actor | None = None) -> str | None:
    """Lease reaper: an expired live lease interrupts a running run, or ends a stop dirty."""
    actor = actor or Actor.system("lease-reaper")
    with transaction.atomic(durable=True):
        run_id = Lease.objects.filter(pk=lease_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return None
        run = _lock_run(run_id)
        lease = Lease.objects.get(pk=lease_id)
        now = timezone.now()
        if lease.released_at is not None or lease.expires_at > now:
            return None  # renewed or released while we waited for the lock
        if run.status == RunStatus.RUNNING and lease.epoch == run.stop_epoch:
            _interrupt_locked(run, reason=StopReason.LEASE_EXPIRED, actor=actor, now=now)
            return RunStatus.INTERRUPTED
        if run.status in STOPPING_STATUSES:
            _release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now, fenced=True)
            _settle_locked(
                run, actor=actor, now=now, forced_dirty_reason="lease_expired_during_drain"
            )
            return run.status
        _release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
        ledger_append(
            run=run, actor=actor, action="lease.expired", payload={"lease_id": lease.token}
        )
        _changed(run, kind="lease.expired")
        return run.status


# --------------------------------------------------------------------------------------------
# tool calls: permit (intent before) and result (after)


def permit_request(
    *,
    run_id: str,
    epoch: int,
    tool_call_id: str,
    tool: str,
    actor: Actor,
    side_effect: str = SideEffect.NONE,
    arguments: dict[str, Any] | None = None,
    idempotency_key: str = "",
    operation_id: str = "",
    recovery_policy: str = "",
    step_key: str = "",
) -> tuple[ExecutionRecord, bool]:
    """Grant a start permit for one tool call, or refuse it. Returns (record, created).

    The permit *is* the intent record: it is written under the run lock, so a stop recorded a
    microsecond earlier refuses it, and a stop a microsecond later finds it as in-flight work.
    """
    refusal: StaleEpoch | RunNotRunning | None = None
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        now = timezone.now()
        refusal = _check_work_may_start(run, epoch, now=now)
        if refusal is None:
            existing = ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first()
            if existing is not None:
                if existing.permit_epoch != epoch:
                    raise IllegalTransition(
                        f"tool call {tool_call_id} was already permitted at epoch {existing.permit_epoch}",
                        status=run.status,
                        stop_epoch=run.stop_epoch,
                    )
                return existing, False
            budget_reason = _budget_exceeded(run, now=now, adding_tool_call=True)
            if budget_reason:
                _stop_locked(
                    run,
                    reason=budget_reason,
                    note="budget enforced at permit",
                    actor=Actor.system("budget"),
                    now=now,
                )
                refusal = _refuse(
                    run,
                    RunNotRunning,
                    f"the run's budget is exhausted ({budget_reason}); it is stopping",
                )
            else:
                record = _create_permit(
                    run,
                    epoch=epoch,
                    tool_call_id=tool_call_id,
                    tool=tool,
                    side_effect=side_effect,
                    arguments=arguments or {},
                    idempotency_key=idempotency_key,
                    operation_id=operation_id,
                    recovery_policy=recovery_policy,
                    step_key=step_key,
                    actor=actor,
                )
                return record, True
    assert refusal is not None
    _reject_late_write(run_id, kind="permit", epoch=epoch, error=refusal)
    raise refusal


def _create_permit(
    run: Run,
    *,
    epoch: int,
    tool_call_id: str,
    tool: str,
    side_effect: str,
    arguments: dict[str, Any],
    idempotency_key: str,
    operation_id: str,
    recovery_policy: str,
    step_key: str,
    actor: Actor,
) -> ExecutionRecord:
    step = _step_for_call(run, step_key)
    record = ExecutionRecord.objects.create(
        run=run,
        step=step,
        tool_call_id=tool_call_id,
        tool=tool,
        arguments=arguments,
        side_effect=side_effect,
        idempotency_key=idempotency_key,
        operation_id=operation_id,
        permit_epoch=epoch,
        recovery_policy=recovery_policy or RecoveryPolicy.MANUAL_CONFIRMATION,
        side_effect_state=(
            SideEffectState.PENDING_VERIFICATION
            if side_effect == SideEffect.WRITE
            else SideEffectState.NONE
        ),
    )
    run.tool_calls_count += 1
    _changed(run, kind="tool.permitted", fields=("tool_calls_count",))
    ledger_append(
        run=run,
        actor=actor,
        action="tool.permitted",
        payload={
            "tool_call_id": tool_call_id,
            "tool": tool,
            "side_effect": side_effect,
            "epoch": epoch,
        },
    )
    return record


def _step_for_call(run: Run, step_key: str) -> Step | None:
    if step_key:
        return Step.objects.filter(run=run, key=step_key).first()
    return Step.objects.filter(run=run, status=StepStatus.RUNNING).order_by("-seq").first()


_RESULT_STATES = {
    ExecutionState.RUNNING,
    ExecutionState.SUCCEEDED,
    ExecutionState.FAILED,
    ExecutionState.NOT_STARTED,
    ExecutionState.UNKNOWN,
}
_SIDE_EFFECT_AFTER: dict[str, str] = {
    ExecutionState.SUCCEEDED: SideEffectState.APPLIED,
    ExecutionState.FAILED: SideEffectState.NOT_APPLIED,
    ExecutionState.NOT_STARTED: SideEffectState.NOT_APPLIED,
    ExecutionState.UNKNOWN: SideEffectState.PENDING_VERIFICATION,
    ExecutionState.RUNNING: SideEffectState.PENDING_VERIFICATION,
}


def tool_result_report(
    *,
    run_id: str,
    tool_call_id: str,
    execution_state: str,
    actor: Actor,
    operation_id: str = "",
    observation: str = "",
    output_truncated: bool = False,
    remote_cancel_state: str = "",
    source: str = "worker",
    recovery_action: str = "",
) -> ExecutionRecord:
    """Record the outcome of a permitted call. Accepted after a stop, as a fact.

    Two facts are never overwritten: a verified success, and a reviewer's resolution.
    """
    if execution_state not in _RESULT_STATES:
        raise InvalidInput(
            f"execution_state must be one of {sorted(_RESULT_STATES)}", field="execution_state"
        )
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        record = ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first()
        if record is None:
            raise NotFound(f"tool call {tool_call_id} was never permitted on run {run_id}")
        now = timezone.now()
        _apply_tool_result(
            run,
            record,
            execution_state=execution_state,
            operation_id=operation_id,
            observation=observation,
            output_truncated=output_truncated,
            remote_cancel_state=remote_cancel_state,
            source=source,
            recovery_action=recovery_action,
            actor=actor,
            now=now,
        )
        _settle_dirty_if_resolved(run, actor=Actor.system("reconciler"), now=now)
    return record


def _apply_tool_result(
    run: Run,
    record: ExecutionRecord,
    *,
    execution_state: str,
    operation_id: str,
    observation: str,
    output_truncated: bool,
    remote_cancel_state: str,
    source: str,
    recovery_action: str,
    actor: Actor,
    now: Any,
) -> None:
    after_stop = run.stop_epoch > record.permit_epoch
    keeps_state = record.execution_state == ExecutionState.SUCCEEDED or record.resolved
    if keeps_state:
        # Seed 001 §6 row 9: a verified success (or a reviewer's decision) stands with its own
        # evidence; a later, contradicting report (e.g. a drain saying "unknown") is kept as a
        # fact in the ledger only, and does not make the success look "reported after stop".
        ledger_append(
            run=run,
            actor=actor,
            action="tool.result",
            payload={
                "tool_call_id": record.tool_call_id,
                "reported": execution_state,
                "kept": record.execution_state,
                "reported_after_stop": after_stop,
                "side_effect_state": record.side_effect_state,
                "ignored_observation": observation[:500],
            },
        )
        _changed(run, kind="tool.result")
        return
    record.last_observation = observation or record.last_observation
    record.observed_at = now
    record.observation_source = source
    record.output_truncated = record.output_truncated or output_truncated
    record.operation_id = operation_id or record.operation_id
    record.recovery_action = recovery_action or record.recovery_action
    if remote_cancel_state:
        record.remote_cancel_state = remote_cancel_state
    record.reported_after_stop = record.reported_after_stop or after_stop
    record.execution_state = execution_state
    if record.side_effect == SideEffect.WRITE:
        record.side_effect_state = _SIDE_EFFECT_AFTER[execution_state]
    if execution_state != ExecutionState.RUNNING:
        record.finished_at = now
    record.save()
    ledger_append(
        run=run,
        actor=actor,
        action="tool.result",
        payload={
            "tool_call_id": record.tool_call_id,
            "reported": execution_state,
            "kept": record.execution_state,
            "reported_after_stop": after_stop,
            "side_effect_state": record.side_effect_state,
        },
    )
    _changed(run, kind="tool.result")


# --------------------------------------------------------------------------------------------
# events (batched)


@dataclass
class EventAnswer:
    event_id: str
    status: str  # accepted | duplicate | rejected
    code: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"event_id": self.event_id, "status": self.status}
        if self.code:
            body["code"] = self.code
        if self.detail:
            body["detail"] = self.detail
        return body


class _EventRejected(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


EVENT_TYPES = (
    "step.started",
    "step.completed",
    "step.failed",
    "artifact.added",
    "checkpoint.saved",
    "steering.applied",
    "run.suspended",
    "run.completed",
    "run.failed",
)
# Events that start work or move the run forward need the current epoch and a running run.
# The rest are facts about work already done and are accepted from the epoch that did it.
_FORWARD_EVENTS = {
    "step.started",
    "steering.applied",
    "run.suspended",
    "run.completed",
    "run.failed",
}


def events_ingest(
    *, run_id: str, epoch: int, events: list[dict[str, Any]], actor: Actor
) -> list[EventAnswer]:
    """Apply a batch in one transaction under one run lock; answer every event."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        now = timezone.now()
        ids = [str(event.get("event_id", "")) for event in events]
        seen = dict(
            EventReceipt.objects.filter(run=run, event_id__in=ids).values_list(
                "event_id", "outcome"
            )
        )
        answers: list[EventAnswer] = []
        receipts: list[EventReceipt] = []
        stale = 0
        steps = _BatchSteps(run, events)
        for event in events:
            event_id = str(event.get("event_id", ""))
            event_type = str(event.get("type", ""))
            if event_id in seen:
                answers.append(EventAnswer(event_id, "duplicate"))
                continue
            try:
                _apply_event(run, event_type, event, epoch=epoch, actor=actor, now=now, steps=steps)
                answer = EventAnswer(event_id, "accepted")
            except _EventRejected as rejected:
                answer = EventAnswer(event_id, "rejected", rejected.code, rejected.detail)
                stale += rejected.code == "stale_epoch"
            seen[event_id] = answer.status
            answers.append(answer)
            receipts.append(
                EventReceipt(
                    run=run,
                    event_id=event_id,
                    type=event_type[:40],
                    epoch=epoch,
                    outcome=answer.status,
                    code=answer.code,
                )
            )
        steps.flush()
        EventReceipt.objects.bulk_create(receipts)
        if stale:
            RejectedWrite.objects.bulk_create(
                RejectedWrite(
                    run=run, kind="event", epoch=epoch, run_epoch=run.stop_epoch, code="stale_epoch"
                )
                for _ in range(stale)
            )
            run.late_writes_rejected += stale
            run.save(update_fields=["late_writes_rejected"])
        if (
            any(answer.status == "accepted" for answer in answers)
            and run.status not in TERMINAL_STATUSES
        ):
            _changed(run, kind="events")
    return answers


# Every field an event handler may set on a step.
_STEP_EVENT_FIELDS = [
    "name",
    "kind",
    "status",
    "epoch",
    "started_at",
    "finished_at",
    "reported_after_stop",
    "detail",
]


class _BatchSteps:
    """The steps one events batch names: read in one query, changed in memory, written once.

    Under the run lock nobody else writes this run's steps, so the objects here are what the
    database holds plus this batch's changes. `flush()` writes them: new steps in one INSERT
    (a step started and completed in the same batch is inserted completed), changed ones in one
    UPDATE. Before, every step event cost a lookup and a write of its own, and every new step a
    read of the last seq (docs/BENCHMARKS.md, ingestion).
    """

    def __init__(self, run: Run, events: list[dict[str, Any]]) -> None:
        self.run = run
        keys = {
            str(value)[:120]
            for event in events
            for name in ("key", "step_key")
            if isinstance(value := event.get(name), str | int | float) and str(value)
        }
        # One query for the named steps *and* the run's last step (its seq numbers the new ones):
        # a single-event request used to spend a second round trip on "SELECT max(seq)".
        last_step = Step.objects.filter(run=run).order_by("-seq").values("pk")[:1]
        found = (
            list(Step.objects.filter(Q(key__in=keys) | Q(pk__in=last_step), run=run))
            if keys
            else []
        )
        self.by_key = {step.key: step for step in found if step.key in keys}
        self._next_seq: int | None = (
            max((step.seq for step in found), default=0) + 1 if keys else None
        )
        self._new: list[Step] = []
        self._changed: dict[int, Step] = {}

    def get(self, key: str) -> Step | None:
        return self.by_key.get(key)

    def saved(self, key: str) -> Step | None:
        """The step, with a primary key (for a row that points at it)."""
        step = self.by_key.get(key)
        if step is not None and step.pk is None:
            self.flush()
        return step

    def new(self, key: str) -> Step:
        if self._next_seq is None:
            last = (
                Step.objects.filter(run=self.run)
                .order_by("-seq")
                .values_list("seq", flat=True)
                .first()
            )
            self._next_seq = (last or 0) + 1
        step = Step(run=self.run, seq=self._next_seq, key=key)
        self._next_seq += 1
        self.by_key[key] = step
        self._new.append(step)
        return step

    def changed(self, step: Step) -> None:
        if step.pk is not None:  # a new step is inserted whole by flush()
            self._changed[step.pk] = step

    def flush(self) -> None:
        if self._new:
            Step.objects.bulk_create(self._new)
            self._new = []
        if len(self._changed) == 1:
            # One step (every single-event request): a plain UPDATE. bulk_update's CASE WHEN per
            # field cost more to compile than the rest of the request's queries together.
            (step,) = self._changed.values()
            step.save(update_fields=_STEP_EVENT_FIELDS)
        elif self._changed:
            Step.objects.bulk_update(list(self._changed.values()), _STEP_EVENT_FIELDS)
        self._changed = {}


def _apply_event(
    run: Run,
    event_type: str,
    event: dict[str, Any],
    *,
    epoch: int,
    actor: Actor,
    now: Any,
    steps: _BatchSteps,
) -> None:
    if event_type not in EVENT_TYPES:
        raise _EventRejected("unknown_event_type", f"type must be one of {', '.join(EVENT_TYPES)}")
    if event_type in _FORWARD_EVENTS:
        if epoch != run.stop_epoch:
            _keep_late_outcome(run, event_type, event, epoch=epoch, actor=actor, now=now)
            raise _EventRejected(
                "stale_epoch", f"epoch {epoch} is not the run's current epoch {run.stop_epoch}"
            )
        if run.status != RunStatus.RUNNING:
            raise _EventRejected("run_not_running", f"the run is {run.status}")
    elif epoch > run.stop_epoch:
        raise _EventRejected(
            "stale_epoch", f"epoch {epoch} is ahead of the run's epoch {run.stop_epoch}"
        )
    handler = _EVENT_HANDLERS[event_type]
    handler(run, event, epoch=epoch, actor=actor, now=now, steps=steps)


def _keep_late_outcome(
    run: Run, event_type: str, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any
) -> None:
    """DESIGN §2: a completion after the stop does not move the run but is kept as a fact."""
    if event_type not in ("run.completed", "run.failed"):
        return
    report = {
        "type": event_type,
        "epoch": epoch,
        "at": now.isoformat(),
        "event_id": event.get("event_id"),
        "result": event.get("result"),
        "error": event.get("error"),
        "reported_after_stop": True,
    }
    run.late_reports = [*run.late_reports, report]
    run.save(update_fields=["late_reports"])
    ledger_append(
        run=run,
        actor=actor,
        action="run.outcome_reported_after_stop",
        reason=event_type,
        payload={"epoch": epoch, "event_id": event.get("event_id")},
    )


def _text(event: dict[str, Any], key: str, default: str = "", limit: int = 300) -> str:
    value = event.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str | int | float):
        raise _EventRejected("invalid", f"{key} must be a string")
    return str(value)[:limit]


def _on_step_started(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    key = _text(event, "key", limit=120)
    if not key:
        raise _EventRejected("invalid", "step.started needs a key")
    kind = _text(event, "kind", StepKind.MODEL_CALL)
    if kind not in StepKind.values:
        raise _EventRejected("invalid", f"kind must be one of {', '.join(StepKind.values)}")
    existing = steps.get(key)
    # Validate everything before a new step takes a seq (a rejected event writes nothing).
    name = _text(event, "name", (existing.name if existing else "") or key)
    step = existing or steps.new(key)
    step.name = name
    step.kind = kind
    step.status = StepStatus.RUNNING
    step.epoch = epoch
    step.started_at = now
    step.finished_at = None
    steps.changed(step)


def _step_owned_by_epoch(run: Run, event: dict[str, Any], epoch: int, steps: _BatchSteps) -> Step:
    key = _text(event, "key", limit=120)
    step = steps.get(key)
    if step is None:
        raise _EventRejected("unknown_step", f"no step {key!r} on this run")
    if step.epoch != epoch:
        # An old worker may report on the steps *it* ran, never on a newer round's.
        raise _EventRejected(
            "stale_epoch", f"step {key!r} belongs to epoch {step.epoch}, not {epoch}"
        )
    return step


def _on_step_finished(status: str) -> Any:
    def handler(
        run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
    ) -> None:
        step = _step_owned_by_epoch(run, event, epoch, steps)
        step.status = status
        step.finished_at = now
        step.reported_after_stop = epoch < run.stop_epoch
        detail = event.get("detail") or event.get("error")
        if detail is not None:
            step.detail = detail if isinstance(detail, dict) else {"detail": str(detail)[:2000]}
        steps.changed(step)

    return handler


def _on_artifact_added(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    name = _text(event, "name")
    if not name:
        raise _EventRejected("invalid", "artifact.added needs a name")
    step_key = _text(event, "step_key", limit=120)
    Artifact.objects.create(
        run=run,
        step=steps.saved(step_key) if step_key else None,
        name=name,
        kind=_text(event, "kind", limit=60),
        uri=_text(event, "uri", limit=1000),
        content=_text(event, "content", limit=100_000),
        checksum=_text(event, "checksum", limit=128),
        reusable=bool(event.get("reusable", False)),
        evidence=bool(event.get("evidence", False)),
        epoch=epoch,
    )


def _on_checkpoint_saved(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    label = _text(event, "label", limit=120)
    if not label:
        raise _EventRejected("invalid", "checkpoint.saved needs a label")
    state = event.get("state") or {}
    if not isinstance(state, dict):
        raise _EventRejected("invalid", "state must be an object")
    step_seq = event.get("step_seq")
    Checkpoint.objects.create(
        run=run,
        label=label,
        state=state,
        epoch=epoch,
        step_seq=step_seq if isinstance(step_seq, int) and step_seq >= 0 else None,
    )
    # Only the epoch being stopped (or the running one) may move the resume point; an older
    # round's checkpoint is kept but never redirects a newer round.
    if epoch == run.stop_epoch or (
        epoch == run.stop_epoch - 1 and run.status in (*STOPPING_STATUSES, *STOPPED_STATUSES)
    ):
        run.resume_from = label
        run.save(update_fields=["resume_from"])


def _on_steering_applied(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    message_id = event.get("steering_id")
    updated = SteeringMessage.objects.filter(
        run=run,
        pk=message_id if isinstance(message_id, int) else -1,
        status__in=(SteeringStatus.QUEUED, SteeringStatus.CARRIED_OVER),
    ).update(status=SteeringStatus.APPLIED, applied_at=now)
    if not updated:
        raise _EventRejected("unknown_steering", f"no queued steering message {message_id!r}")


def _on_run_suspended(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    lease = _live_lease(run)
    if lease is not None:
        _release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    run.interruption = {
        "suspended_because": _text(event, "reason", limit=500),
        "at": now.isoformat(),
    }
    _move(
        run,
        RunStatus.SUSPENDED,
        actor=actor,
        action="run.suspended",
        reason=_text(event, "reason", limit=60),
        fields=("interruption",),
    )


def _on_run_completed(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    _finish_locked(run, RunStatus.COMPLETED, actor=actor, now=now, result=event.get("result"))


def _on_run_failed(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    error = event.get("error")
    _finish_locked(
        run,
        RunStatus.FAILED,
        actor=actor,
        now=now,
        failure=error if isinstance(error, dict) else {"error": str(error)},
    )


_EVENT_HANDLERS = {
    "step.started": _on_step_started,
    "step.completed": _on_step_finished(StepStatus.COMPLETED),
    "step.failed": _on_step_finished(StepStatus.FAILED),
    "artifact.added": _on_artifact_added,
    "checkpoint.saved": _on_checkpoint_saved,
    "steering.applied": _on_steering_applied,
    "run.suspended": _on_run_suspended,
    "run.completed": _on_run_completed,
    "run.failed": _on_run_failed,
}


def _finish_locked(
    run: Run, to: str, *, actor: Actor, now: Any, result: Any = None, failure: Any = None
) -> None:
    lease = _live_lease(run)
    if lease is not None:
        _release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    run.finished_at = now
    fields = ["finished_at"]
    if to == RunStatus.COMPLETED:
        run.result = result
        fields.append("result")
    else:
        run.failure = failure
        fields.append("failure")
    _move(run, to, actor=actor, action=f"run.{to}", fields=tuple(fields))


def run_complete(*, run_id: str, epoch: int, actor: Actor, result: Any = None) -> Run:
    """The worker finished. Wins over a stop only if it is recorded first (DESIGN §2)."""
    answers = events_ingest(
        run_id=run_id,
        epoch=epoch,
        actor=actor,
        events=[
            {
                "event_id": "complete_" + secrets.token_hex(8),
                "type": "run.completed",
                "result": result,
            }
        ],
    )
    _raise_for_answer(run_id, answers[0])
    return Run.objects.get(pk=run_id)


def run_fail(*, run_id: str, epoch: int, actor: Actor, error: Any = None) -> Run:
    answers = events_ingest(
        run_id=run_id,
        epoch=epoch,
        actor=actor,
        events=[{"event_id": "fail_" + secrets.token_hex(8), "type": "run.failed", "error": error}],
    )
    _raise_for_answer(run_id, answers[0])
    return Run.objects.get(pk=run_id)


def run_suspend(*, run_id: str, epoch: int, actor: Actor, reason: str = "") -> Run:
    answers = events_ingest(
        run_id=run_id,
        epoch=epoch,
        actor=actor,
        events=[
            {
                "event_id": "suspend_" + secrets.token_hex(8),
                "type": "run.suspended",
                "reason": reason,
            }
        ],
    )
    _raise_for_answer(run_id, answers[0])
    return Run.objects.get(pk=run_id)


def _raise_for_answer(run_id: str, answer: EventAnswer) -> None:
    if answer.status == "accepted":
        return
    run = Run.objects.get(pk=run_id)
    error_cls = StaleEpoch if answer.code == "stale_epoch" else RunNotRunning
    raise error_cls(answer.detail or answer.code, status=run.status, stop_epoch=run.stop_epoch)


# --------------------------------------------------------------------------------------------
# interruption


def run_interrupt(*, run_id: str, reason: str, actor: Actor, detail: str = "") -> Run:
    """running → interrupted (a worker or dependency failed); the interruption point is kept."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status != RunStatus.RUNNING:
            raise IllegalTransition(
                f"a {run.status} run cannot be interrupted",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        _interrupt_locked(run, reason=reason, actor=actor, now=timezone.now(), detail=detail)
    return run


def _interrupt_locked(
    run: Run,
    *,
    reason: str,
    actor: Actor,
    now: Any,
    detail: str = "",
    lease_already_closed: bool = False,
) -> None:
    lease = _live_lease(run)
    if lease is not None and not lease_already_closed:
        _release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
    in_flight = list(
        ExecutionRecord.objects.filter(run=run, execution_state__in=OPEN_EXECUTION_STATES)
    )
    _mark_outcomes_unknown(in_flight, now=now, source="interruption")
    # An interruption is a failure: what the worker queued is not sent on anyone's say-so but a
    # reviewer's (release), and a later resume (new epoch) cannot strand it as `pending`.
    frozen = _freeze_outbox(run, now=now)
    current = Step.objects.filter(run=run, status=StepStatus.RUNNING).order_by("-seq").first()
    run.interruption = {
        "reason": reason,
        "detail": detail,
        "at": now.isoformat(),
        "current_step": {"seq": current.seq, "key": current.key} if current else None,
        "calls_in_flight": [record.tool_call_id for record in in_flight],
        "frozen_outbox": frozen,
        "worker_id": lease.worker_id if lease else None,
    }
    _move(
        run,
        RunStatus.INTERRUPTED,
        actor=actor,
        action="run.interrupted",
        reason=reason,
        payload={"calls_in_flight": run.interruption["calls_in_flight"]},
        fields=("interruption",),
    )


def _mark_outcomes_unknown(records: list[ExecutionRecord], *, now: Any, source: str) -> None:
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


# --------------------------------------------------------------------------------------------
# outbox: enqueue, claim, outcome, freeze / release / discard, reaper


def _webhook_host_allowed(destination: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(destination)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    allowed = {host.lower() for host in settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS}
    host = parts.hostname.lower()
    with_port = f"{host}:{parts.port}" if parts.port else host
    return with_port in allowed or (parts.port is None and host in allowed)


def validate_outbox_destination(transport: str, destination: str) -> None:
    if transport not in TRANSPORTS:
        raise InvalidInput(f"transport must be one of {', '.join(TRANSPORTS)}", field="transport")
    if transport == "webhook" and not _webhook_host_allowed(destination):
        raise InvalidInput(
            "webhook destination is not an http(s) URL on SAFESTOP_WEBHOOK_ALLOWED_HOSTS",
            field="destination",
        )
    if transport == "email" and ("@" not in destination or len(destination) > 254):
        raise InvalidInput("email destination must be an address", field="destination")


def outbox_enqueue(
    *,
    run_id: str,
    epoch: int,
    transport: str,
    destination: str,
    payload: dict[str, Any],
    idempotency_key: str,
    actor: Actor,
    tool_call_id: str = "",
) -> tuple[OutboxItem, bool]:
    """Queue a side effect for the server to dispatch. A retry returns the first item."""
    validate_outbox_destination(transport, destination)
    if not idempotency_key:
        raise InvalidInput("idempotency_key is required", field="idempotency_key")
    refusal: StaleEpoch | RunNotRunning | None
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        existing = OutboxItem.objects.filter(run=run, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing, False
        refusal = _check_work_may_start(run, epoch, now=timezone.now())
        if refusal is None:
            record = (
                ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first()
                if tool_call_id
                else None
            )
            item = OutboxItem.objects.create(
                run=run,
                execution_record=record,
                transport=transport,
                destination=destination,
                payload=payload,
                idempotency_key=idempotency_key,
                enqueue_epoch=epoch,
            )
            ledger_append(
                run=run,
                actor=actor,
                action="outbox.enqueued",
                payload={
                    "outbox_id": item.public_id,
                    "transport": transport,
                    "idempotency_key": idempotency_key,
                },
            )
            _changed(run, kind="outbox.enqueued")
            return item, True
    _reject_late_write(run_id, kind="outbox", epoch=epoch, error=refusal)
    raise refusal


def outbox_claim(*, item_id: int, dispatcher: str) -> OutboxItem | None:
    """Claim one item for sending, or None. Serialises with the stop on the run row.

    An item is either claimed here before the stop commits (then it is in flight and its
    outcome is recorded), or frozen by the stop — never sent after it.
    """
    with transaction.atomic(durable=True):
        run_id = OutboxItem.objects.filter(pk=item_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return None
        run = _lock_run(run_id)
        item = OutboxItem.objects.select_for_update().get(pk=item_id)
        released = item.status == OutboxStatus.RELEASED
        open_for_dispatch = (
            item.status == OutboxStatus.PENDING
            and run.status == RunStatus.RUNNING
            and item.enqueue_epoch == run.stop_epoch
        )
        if not (released or open_for_dispatch):
            return None
        now = timezone.now()
        item.status = OutboxStatus.DISPATCHING
        item.claimed_at = now
        item.claimed_by = dispatcher[:120]
        item.claim_epoch = run.stop_epoch
        item.attempts += 1
        item.save(
            update_fields=[
                "status",
                "claimed_at",
                "claimed_by",
                "claim_epoch",
                "attempts",
                "updated_at",
            ]
        )
        ledger_append(
            run=run,
            actor=Actor.system(dispatcher[:150]),
            action="outbox.claimed",
            payload={"outbox_id": item.public_id, "epoch": run.stop_epoch, "released": released},
        )
        _changed(run, kind="outbox.claimed")
    return item


def outbox_claim_next(*, dispatcher: str, batch: int = 20) -> OutboxItem | None:
    """The dispatcher's scan: the oldest claimable item (uses the `outbox_pending_idx` index).

    Only items `outbox_claim` could accept are candidates: a pending item left at an older
    epoch (its run was interrupted, then resumed) can never be claimed, and `batch` of them at
    the head of the queue would otherwise hide every newer item from every dispatcher.
    """
    candidates = list(
        OutboxItem.objects.filter(
            Q(
                status=OutboxStatus.PENDING,
                run__status=RunStatus.RUNNING,
                enqueue_epoch=F("run__stop_epoch"),
            )
            | Q(
                status=OutboxStatus.RELEASED,
                run__status__in=(
                    RunStatus.RUNNING,
                    *STOPPED_STATUSES,
                    RunStatus.HANDED_OFF,
                    RunStatus.CANCEL_REQUESTED,
                    RunStatus.DRAINING,
                ),
            )
        )
        .order_by("created_at")
        .values_list("pk", flat=True)[:batch]
    )
    for item_id in candidates:
        item = outbox_claim(item_id=item_id, dispatcher=dispatcher)
        if item is not None:
            return item
    return None


OUTBOX_OUTCOMES = (OutboxStatus.SENT, OutboxStatus.FAILED, OutboxStatus.UNKNOWN)


def outbox_record_outcome(
    *,
    item_id: int,
    outcome: str,
    dispatcher: str = "dispatcher",
    response_status: int | None = None,
    error: str = "",
) -> OutboxItem:
    """What the transport said. A late answer for an item reaped to `unknown` is still a fact."""
    if outcome not in OUTBOX_OUTCOMES:
        raise InvalidInput(f"outcome must be one of {OUTBOX_OUTCOMES}")
    with transaction.atomic(durable=True):
        run_id = OutboxItem.objects.filter(pk=item_id).values_list("run_id", flat=True).first()
        if run_id is None:
            raise NotFound(f"outbox item {item_id} does not exist")
        run = _lock_run(run_id)
        item = OutboxItem.objects.select_for_update().get(pk=item_id)
        if item.status not in IN_FLIGHT_OUTBOX or item.resolved:
            return item  # already settled (by a reviewer, or a duplicate answer)
        if item.status == OutboxStatus.UNKNOWN and outcome == OutboxStatus.UNKNOWN:
            return item
        now = timezone.now()
        item.status = outcome
        item.response_status = response_status
        item.last_error = error[:2000]
        if outcome == OutboxStatus.SENT:
            item.sent_at = now
        item.save(
            update_fields=["status", "response_status", "last_error", "sent_at", "updated_at"]
        )
        ledger_append(
            run=run,
            actor=Actor.system(dispatcher[:150]),
            action=f"outbox.{outcome}",
            payload={
                "outbox_id": item.public_id,
                "response_status": response_status,
                "error": error[:200],
            },
        )
        _changed(run, kind=f"outbox.{outcome}")
        _settle_dirty_if_resolved(run, actor=Actor.system("reconciler"), now=now)
    return item


def outbox_reap_stuck(*, item_id: int, older_than_seconds: float) -> bool:
    """A dispatcher that died mid-send leaves `dispatching`: make it `unknown`, never re-send."""
    with transaction.atomic(durable=True):
        run_id = OutboxItem.objects.filter(pk=item_id).values_list("run_id", flat=True).first()
        if run_id is None:
            return False
        run = _lock_run(run_id)
        item = OutboxItem.objects.select_for_update().get(pk=item_id)
        now = timezone.now()
        if item.status != OutboxStatus.DISPATCHING or item.claimed_at is None:
            return False
        if (now - item.claimed_at).total_seconds() < older_than_seconds:
            return False
        item.status = OutboxStatus.UNKNOWN
        item.last_error = (
            f"dispatcher {item.claimed_by} gave no outcome within {older_than_seconds:.0f}s"
        )
        item.save(update_fields=["status", "last_error", "updated_at"])
        ledger_append(
            run=run,
            actor=Actor.system("outbox-reaper"),
            action="outbox.unknown",
            reason="dispatch_deadline",
            payload={"outbox_id": item.public_id, "claimed_by": item.claimed_by},
        )
        _changed(run, kind="outbox.unknown")
    return True


def _freeze_outbox(run: Run, *, now: Any) -> int:
    """Freeze the run's pending items; returns how many. Called under the run lock, which every
    enqueue also takes, so no item can slip in between. One set-based UPDATE, not a read of
    every id followed by an UPDATE with a 1,000-element IN list (docs/BENCHMARKS.md)."""
    return OutboxItem.objects.filter(run=run, status=OutboxStatus.PENDING).update(
        status=OutboxStatus.FROZEN, frozen_at=now, frozen_by_epoch=run.stop_epoch, updated_at=now
    )


def outbox_release(*, run_id: str, item_id: int, actor: Actor, note: str = "") -> OutboxItem:
    """A reviewer lets one frozen item go out after all (ledgered)."""
    return _decide_frozen(
        run_id=run_id, item_id=item_id, actor=actor, to=OutboxStatus.RELEASED, note=note
    )


def outbox_discard(*, run_id: str, item_id: int, actor: Actor, note: str = "") -> OutboxItem:
    return _decide_frozen(
        run_id=run_id, item_id=item_id, actor=actor, to=OutboxStatus.DISCARDED, note=note
    )


def _decide_frozen(*, run_id: str, item_id: int, actor: Actor, to: str, note: str) -> OutboxItem:
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        item = OutboxItem.objects.select_for_update().filter(run=run, pk=item_id).first()
        if item is None:
            raise NotFound(f"outbox item {item_id} is not on run {run_id}")
        if item.status == to:
            return item  # a double click decides once
        if item.status != OutboxStatus.FROZEN:
            raise IllegalTransition(
                f"only a frozen item can be {to}; this one is {item.status}",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if run.status not in (
            *STOPPED_STATUSES,
            RunStatus.INTERRUPTED,
            RunStatus.HANDED_OFF,
            *TERMINAL_STATUSES,
        ):
            raise IllegalTransition(
                "frozen items are decided once the run has stopped",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        item.status = to
        item.save(update_fields=["status", "updated_at"])
        ledger_append(
            run=run,
            actor=actor,
            action=f"outbox.{to}",
            reason=note[:60],
            payload={"outbox_id": item.public_id, "note": note},
        )
        _changed(run, kind=f"outbox.{to}")
    return item


# --------------------------------------------------------------------------------------------
# stop


@dataclass
class StopOutcome:
    stop_request: StopRequest | None
    created: bool
    already_finished: bool = False
    status: str = ""
    stop_epoch: int = 0


def run_stop(
    *, run_id: str, reason: str, actor: Actor, note: str = "", takeover: bool = False
) -> StopOutcome:
    """Record a stop: close the entrance, freeze the outbox, bump the epoch, signal the worker.

    Idempotent: a repeat returns the same StopRequest and writes nothing. A stop that arrives
    after the run finished is answered "already finished", logged, and changes nothing.
    """
    if reason not in StopReason.values:
        raise InvalidInput(f"reason must be one of {', '.join(StopReason.values)}", field="reason")
    takeover = takeover or reason == StopReason.MANUAL_TAKEOVER
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        now = timezone.now()
        if run.status in TERMINAL_STATUSES:
            ledger_append(
                run=run,
                actor=actor,
                action="stop.ignored",
                reason=reason,
                payload={"status": run.status, "why": "already finished"},
            )
            return StopOutcome(
                None, False, already_finished=True, status=run.status, stop_epoch=run.stop_epoch
            )
        if run.status not in STOPPABLE_STATUSES:
            stop_request = _current_stop_request(run)
            if takeover and not stop_request.takeover:
                _upgrade_to_takeover(run, stop_request, actor=actor, now=now)
            return StopOutcome(stop_request, False, status=run.status, stop_epoch=run.stop_epoch)
        stop_request = _stop_locked(
            run, reason=reason, note=note, actor=actor, now=now, takeover=takeover
        )
        return StopOutcome(stop_request, True, status=run.status, stop_epoch=run.stop_epoch)


def run_takeover(*, run_id: str, actor: Actor, note: str = "") -> StopOutcome:
    """Take over = a stop with reason manual_takeover that ends in handed_off once clean."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status == RunStatus.STOPPED_CLEANLY:
            now = timezone.now()
            stop_request = _current_stop_request(run)
            _hand_off_locked(run, stop_request, actor=actor, now=now, note=note)
            return StopOutcome(stop_request, False, status=run.status, stop_epoch=run.stop_epoch)
    return run_stop(
        run_id=run_id, reason=StopReason.MANUAL_TAKEOVER, actor=actor, note=note, takeover=True
    )


def _current_stop_request(run: Run) -> StopRequest:
    stop_request = StopRequest.objects.filter(run=run).order_by("-epoch_after").first()
    if stop_request is None:
        raise IllegalTransition(
            "the run has no stop request", status=run.status, stop_epoch=run.stop_epoch
        )
    return stop_request


def _upgrade_to_takeover(run: Run, stop_request: StopRequest, *, actor: Actor, now: Any) -> None:
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
        _changed(run, kind="stop.takeover_requested")


def _stop_locked(
    run: Run, *, reason: str, note: str, actor: Actor, now: Any, takeover: bool = False
) -> StopRequest:
    """1. close the entrance and bump the epoch; 2. freeze the outbox; 3. flag calls in flight;
    4. mark unapplied steering; 5. ledger + signal on commit; 6. with no live lease, drain and
    settle at once, in this same transaction."""
    epoch_before = run.stop_epoch
    run.stop_epoch = epoch_before + 1
    run.stop_reason = reason
    run.stop_requested_by = actor.name
    run.stop_requested_at = now
    stop_request = StopRequest.objects.create(
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
    frozen = _freeze_outbox(run, now=now)
    ExecutionRecord.objects.filter(run=run, execution_state__in=OPEN_EXECUTION_STATES).update(
        cancel_requested=True, remote_cancel_state=RemoteCancelState.REQUESTED
    )
    SteeringMessage.objects.filter(
        run=run, status__in=(SteeringStatus.QUEUED, SteeringStatus.CARRIED_OVER)
    ).update(status=SteeringStatus.UNAPPLIED_AT_STOP)
    _move(
        run,
        RunStatus.CANCEL_REQUESTED,
        actor=actor,
        action="run.stop_requested",
        reason=reason,
        payload={
            "stop_request_id": stop_request.pk,
            "epoch_before": epoch_before,
            "note": note,
            "frozen_outbox": frozen,
            "takeover": takeover,
        },
        fields=("stop_epoch", "stop_reason", "stop_requested_by", "stop_requested_at"),
    )
    notify.stop_signal(run, stop_request)
    lease = _live_lease(run)
    if lease is None or lease.expires_at <= now:
        if lease is not None:
            _release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
        _move(
            run,
            RunStatus.DRAINING,
            actor=Actor.system(),
            action="run.draining",
            reason="no_live_lease",
        )
        stop_request.drained_at = now
        stop_request.save(update_fields=["drained_at"])
        _settle_locked(run, actor=Actor.system(), now=now)
    return stop_request


def run_acknowledge_stop(*, run_id: str, actor: Actor, via: str = "websocket") -> Run:
    """The worker noticed the signal: cancel_requested → draining."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status == RunStatus.CANCEL_REQUESTED:
            _acknowledge_locked(
                run, _current_stop_request(run), actor=actor, now=timezone.now(), via=via
            )
    return run


def _acknowledge_locked(
    run: Run, stop_request: StopRequest, *, actor: Actor, now: Any, via: str
) -> None:
    stop_request.acknowledged_at = now
    stop_request.signal_delivered_at = stop_request.signal_delivered_at or now
    stop_request.save(update_fields=["acknowledged_at", "signal_delivered_at"])
    _move(
        run,
        RunStatus.DRAINING,
        actor=actor,
        action="run.draining",
        reason="worker_ack",
        payload={"via": via},
    )


def stop_signal_delivered(*, run_id: str, stop_epoch: int) -> None:
    """The push reached a worker's socket: record when (stop-quality: time to the worker)."""
    StopRequest.objects.filter(
        run_id=run_id, epoch_after=stop_epoch, signal_delivered_at__isnull=True
    ).update(signal_delivered_at=timezone.now())


def run_drained(
    *,
    run_id: str,
    lease_token: str,
    epoch: int,
    actor: Actor,
    observations: list[dict[str, Any]] | None = None,
) -> Run:
    """The worker says it has stopped; its observations are recorded as facts, then settle."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        lease = _find_lease(run, lease_token)
        if epoch != lease.epoch:
            raise StaleEpoch(
                f"the lease was acquired at epoch {lease.epoch}, not {epoch}",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if (
            run.status in STOPPED_STATUSES
            or run.status in TERMINAL_STATUSES
            or run.status == RunStatus.HANDED_OFF
        ):
            return run  # a retry after the stop already settled
        if run.status not in STOPPING_STATUSES:
            raise IllegalTransition(
                f"a {run.status} run has no stop to drain",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if lease.released_at is not None and lease.fenced_unconfirmed:
            raise LeaseRevoked(
                "the lease was fenced off", status=run.status, stop_epoch=run.stop_epoch
            )
        _drained_locked(
            run, lease, observations=observations or [], actor=actor, now=timezone.now()
        )
    return run


def _drained_locked(
    run: Run, lease: Lease, *, observations: list[dict[str, Any]], actor: Actor, now: Any
) -> None:
    stop_request = _current_stop_request(run)
    for observation in observations:
        _apply_drain_observation(run, observation, actor=actor, now=now)
    stop_request.drained_at = now
    stop_request.drain_observations = observations[:200]
    stop_request.save(update_fields=["drained_at", "drain_observations"])
    if lease.released_at is None:
        _release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    if run.status == RunStatus.CANCEL_REQUESTED:
        _acknowledge_locked(run, stop_request, actor=actor, now=now, via="drained")
    _settle_locked(run, actor=actor, now=now)


def _apply_drain_observation(
    run: Run, observation: dict[str, Any], *, actor: Actor, now: Any
) -> None:
    tool_call_id = str(observation.get("tool_call_id", ""))
    state = str(observation.get("execution_state", ""))
    if not tool_call_id or state not in _RESULT_STATES:
        return
    record = ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first()
    if record is None:
        return
    _apply_tool_result(
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
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status not in STOPPING_STATUSES or run.stop_requested_at is None:
            return False
        now = timezone.now()
        deadline = run.stop_requested_at + timedelta(
            seconds=settings.SAFESTOP_DRAIN_DEADLINE_SECONDS
        )
        if now < deadline:
            return False
        lease = _live_lease(run)
        if lease is not None:
            _release_lease(lease, reason=LeaseReleaseReason.REVOKED_BY_STOP, now=now, fenced=True)
        _settle_locked(run, actor=actor, now=now, forced_dirty_reason=StopReason.DRAIN_DEADLINE)
    return True


def _settle_locked(run: Run, *, actor: Actor, now: Any, forced_dirty_reason: str = "") -> None:
    """The clean/dirty decision, then the stop packet (and the handoff for a takeover).

    1. calls still permitted/running never reported: `unknown` (never assumed failed);
    2. the lease is released, or revoked and fenced;
    3. dirty if anything is unknown: a write whose outcome is unconfirmed, an outbox item in
       flight or unknown, a worker fenced without confirming, or a forced reason;
    4. the packet is built once for this epoch; a clean takeover ends in handed_off.
    """
    from handoff.packets import stop_packet_build

    stop_request = _current_stop_request(run)
    open_calls = list(
        ExecutionRecord.objects.filter(run=run, execution_state__in=OPEN_EXECUTION_STATES)
    )
    _mark_outcomes_unknown(open_calls, now=now, source="stop")
    lease = _live_lease(run)
    if lease is not None:
        _release_lease(
            lease,
            reason=LeaseReleaseReason.REVOKED_BY_STOP,
            now=now,
            fenced=bool(forced_dirty_reason),
        )
    if run.status == RunStatus.CANCEL_REQUESTED and not forced_dirty_reason:
        _move(run, RunStatus.DRAINING, actor=actor, action="run.draining", reason="settling")
    reasons = run_dirty_reasons(run)
    if forced_dirty_reason and forced_dirty_reason not in reasons:
        reasons.insert(0, forced_dirty_reason)
    to = RunStatus.STOPPED_DIRTY if reasons else RunStatus.STOPPED_CLEANLY
    run.stopped_at = now
    stop_request.stopped_at = now
    stop_request.outcome_state = to
    stop_request.dirty_reasons = reasons
    stop_request.save(update_fields=["stopped_at", "outcome_state", "dirty_reasons"])
    _move(
        run,
        to,
        actor=actor,
        action=f"run.{to}",
        reason=forced_dirty_reason or run.stop_reason,
        payload={"dirty_reasons": reasons, "stop_request_id": stop_request.pk},
        fields=("stopped_at",),
    )
    packet = stop_packet_build(run=run, stop_request=stop_request)
    if to == RunStatus.STOPPED_CLEANLY and stop_request.takeover:
        _hand_off_locked(run, stop_request, actor=Actor.system(), now=now, packet=packet)


def run_dirty_reasons(run: Run) -> list[str]:
    """What is still unknown about this run's side effects (empty means clean)."""
    reasons = []
    if ExecutionRecord.objects.filter(
        run=run,
        side_effect=SideEffect.WRITE,
        side_effect_state=SideEffectState.PENDING_VERIFICATION,
        resolved=False,
    ).exists():
        reasons.append("unconfirmed_side_effects")
    if OutboxItem.objects.filter(run=run, status__in=IN_FLIGHT_OUTBOX, resolved=False).exists():
        reasons.append("outbox_in_flight")
    if Lease.objects.filter(run=run, fenced_unconfirmed=True).exists():
        reasons.append("worker_unconfirmed")
    return reasons


def _settle_dirty_if_resolved(run: Run, *, actor: Actor, now: Any) -> None:
    """stopped_dirty → stopped_cleanly once the last unknown is resolved (by a fact or a human)."""
    if run.status != RunStatus.STOPPED_DIRTY or run_dirty_reasons(run):
        return
    _move(
        run,
        RunStatus.STOPPED_CLEANLY,
        actor=actor,
        action="run.stopped_cleanly",
        reason="all_unknowns_resolved",
    )
    stop_request = _current_stop_request(run)
    stop_request.outcome_state = RunStatus.STOPPED_CLEANLY
    stop_request.save(update_fields=["outcome_state"])
    if stop_request.takeover:
        _hand_off_locked(run, stop_request, actor=actor, now=now)


def _hand_off_locked(
    run: Run,
    stop_request: StopRequest,
    *,
    actor: Actor,
    now: Any,
    note: str = "",
    packet: Any = None,
) -> None:
    from django.contrib.auth import get_user_model

    from handoff.models import Handoff, StopPacket

    packet = packet or StopPacket.objects.filter(run=run, stop_epoch=run.stop_epoch).first()
    requester = stop_request.requested_by if stop_request.actor_kind == "user" else ""
    assignee = get_user_model().objects.filter(username=requester).first() if requester else None
    handoff = Handoff.objects.create(
        run=run,
        stop_packet=packet,
        assignee=assignee,
        created_by=actor.name,
        note=note or stop_request.note,
    )
    _move(
        run,
        RunStatus.HANDED_OFF,
        actor=actor,
        action="run.handed_off",
        reason=StopReason.MANUAL_TAKEOVER,
        payload={
            "handoff_id": handoff.pk,
            "assignee": assignee.get_username() if assignee else None,
        },
    )


# --------------------------------------------------------------------------------------------
# resolution, resume, close


@dataclass
class ResolveResult:
    target: str
    target_id: str
    decision: str
    created: bool
    run_status: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


RESOLVABLE_STATUSES = (
    RunStatus.STOPPED_DIRTY,
    RunStatus.STOPPED_CLEANLY,
    RunStatus.INTERRUPTED,
    RunStatus.HANDED_OFF,
)


def resolution_record(
    *, run_id: str, target: str, target_id: str, decision: str, evidence: str, actor: Actor
) -> ResolveResult:
    """A reviewer decides one unknown: applied / not applied / compensated, with evidence."""
    from handoff.models import Resolution, ResolutionDecision, ResolutionTarget

    if target not in (*ResolutionTarget.values, "worker"):
        raise InvalidInput("target must be tool_call, outbox or worker", field="target")
    if decision not in ResolutionDecision.values:
        raise InvalidInput(
            f"decision must be one of {', '.join(ResolutionDecision.values)}", field="decision"
        )
    if not evidence.strip():
        raise InvalidInput("evidence is required: say how you know", field="evidence")
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        existing = Resolution.objects.filter(run=run, target=target, target_id=target_id).first()
        if existing is not None:
            if existing.decision != decision:
                raise IllegalTransition(
                    f"{target} {target_id} was already resolved as {existing.decision}",
                    status=run.status,
                    stop_epoch=run.stop_epoch,
                )
            return ResolveResult(target, target_id, decision, created=False, run_status=run.status)
        if run.status not in RESOLVABLE_STATUSES:
            raise IllegalTransition(
                f"a {run.status} run has nothing to resolve yet",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        _apply_resolution(run, target=target, target_id=target_id, decision=decision)
        try:
            with transaction.atomic():
                Resolution.objects.create(
                    run=run,
                    target=target,
                    target_id=target_id,
                    decision=decision,
                    evidence=evidence,
                    by=actor.name,
                )
        except IntegrityError:
            raise IllegalTransition(
                "already resolved", status=run.status, stop_epoch=run.stop_epoch
            ) from None
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
        _changed(run, kind="resolution.recorded")
        _settle_dirty_if_resolved(run, actor=actor, now=timezone.now())
        return ResolveResult(target, target_id, decision, created=True, run_status=run.status)


def _apply_resolution(run: Run, *, target: str, target_id: str, decision: str) -> None:
    if target == "tool_call":
        record = ExecutionRecord.objects.filter(run=run, tool_call_id=target_id).first()
        if record is None:
            raise NotFound(f"tool call {target_id} is not on run {run.pk}")
        if record.side_effect_state != SideEffectState.PENDING_VERIFICATION:
            raise IllegalTransition(
                f"tool call {target_id} has no unconfirmed side effect ({record.side_effect_state})",
                status=run.status,
                stop_epoch=run.stop_epoch,
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
            raise IllegalTransition(
                f"outbox item {target_id} is {item.status}, not in flight or unknown",
                status=run.status,
                stop_epoch=run.stop_epoch,
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


def parse_outbox_id(value: str | int) -> int:
    text = str(value)
    if text.startswith("outbox_"):
        text = text[len("outbox_") :]
    if not text.isdigit():
        raise InvalidInput(f"{value!r} is not an outbox item id", field="id")
    return int(text)


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
    via: str = "resume",
) -> Run:
    """Back to pending at a new epoch, so no callback of an older round can touch the new one."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status not in RESUMABLE_STATUSES:
            raise IllegalTransition(
                f"a {run.status} run cannot be resumed",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        if run_dirty_reasons(run):
            raise IllegalTransition(
                "resolve the run's unknown side effects before resuming it",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        _resume_locked(
            run,
            actor=actor,
            checkpoint=checkpoint,
            carry_over_steering=carry_over_steering,
            via=via,
        )
    return run


def _end_open_handoffs(run: Run, status: str) -> None:
    """A handed-off run resumed or closed directly: its open handoff ends with it."""
    from handoff.models import Handoff, HandoffStatus

    Handoff.objects.filter(run=run, status__in=(HandoffStatus.OPEN, HandoffStatus.ACCEPTED)).update(
        status=status, closed_at=timezone.now()
    )


def _resume_locked(
    run: Run, *, actor: Actor, checkpoint: str, carry_over_steering: bool, via: str
) -> None:
    if run.status == RunStatus.HANDED_OFF:
        _end_open_handoffs(run, "returned")
    if run.status == RunStatus.SUSPENDED:
        # Suspension is waiting, not failure: items queued before it go out once the run runs
        # again, so they move to the new epoch with it (interruptions and stops froze theirs).
        OutboxItem.objects.filter(run=run, status=OutboxStatus.PENDING).update(
            enqueue_epoch=run.stop_epoch + 1
        )
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
    _move(
        run,
        RunStatus.PENDING,
        actor=actor,
        action=f"run.{via}",
        reason=via,
        payload={
            "resume_from": run.resume_from,
            "steering_carried_over" if carry_over_steering else "steering_discarded": steering,
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
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status not in (RunStatus.STOPPED_CLEANLY, RunStatus.HANDED_OFF):
            raise IllegalTransition(
                f"a {run.status} run cannot be closed"
                + (
                    " until its unknowns are resolved"
                    if run.status == RunStatus.STOPPED_DIRTY
                    else ""
                ),
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        _close_locked(run, actor=actor, note=note)
    return run


def _close_locked(run: Run, *, actor: Actor, note: str) -> None:
    if run.status == RunStatus.HANDED_OFF:
        _end_open_handoffs(run, "closed")
    now = timezone.now()
    run.finished_at = now
    SteeringMessage.objects.filter(run=run, status=SteeringStatus.UNAPPLIED_AT_STOP).update(
        status=SteeringStatus.DISCARDED
    )
    OutboxItem.objects.filter(run=run, status=OutboxStatus.FROZEN).update(
        status=OutboxStatus.DISCARDED, updated_at=now
    )
    _move(
        run,
        RunStatus.CANCELLED,
        actor=actor,
        action="run.closed",
        reason=note[:60],
        payload={"note": note},
        fields=("finished_at",),
    )


# --------------------------------------------------------------------------------------------
# steering


def steering_queue(*, run_id: str, text: str, actor: Actor) -> SteeringMessage:
    """Queue a message for the agent. On a stopped run it waits, unapplied, for the next round."""
    text = text.strip()
    if not text:
        raise InvalidInput("text is required", field="text")
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status in TERMINAL_STATUSES:
            raise IllegalTransition(
                f"a {run.status} run takes no more steering",
                status=run.status,
                stop_epoch=run.stop_epoch,
            )
        status = (
            SteeringStatus.QUEUED
            if run.status in STOPPABLE_STATUSES
            else SteeringStatus.UNAPPLIED_AT_STOP
        )
        message = SteeringMessage.objects.create(
            run=run, author=actor.name, text=text[:10_000], status=status
        )
        ledger_append(
            run=run,
            actor=actor,
            action="steering.queued",
            payload={"steering_id": message.pk, "status": status},
        )
        _changed(run, kind="steering.queued")
    return message


def steering_decide(
    *, run_id: str, message_id: int, carry_over: bool, actor: Actor
) -> SteeringMessage:
    """A human decides what happens to a message the agent never applied before the stop."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        message = SteeringMessage.objects.filter(run=run, pk=message_id).first()
        if message is None:
            raise NotFound(f"steering message {message_id} is not on run {run_id}")
        target = SteeringStatus.CARRIED_OVER if carry_over else SteeringStatus.DISCARDED
        if message.status == target:
            return message
        if message.status != SteeringStatus.UNAPPLIED_AT_STOP:
            raise IllegalTransition(
                f"the message is {message.status}", status=run.status, stop_epoch=run.stop_epoch
            )
        message.status = target
        message.save(update_fields=["status"])
        ledger_append(
            run=run, actor=actor, action=f"steering.{target}", payload={"steering_id": message.pk}
        )
        _changed(run, kind=f"steering.{target}")
    return message


# --------------------------------------------------------------------------------------------
# budget


def _budget_exceeded(run: Run, *, now: Any, adding_tool_call: bool = False) -> str:
    if (
        run.max_tool_calls is not None
        and run.tool_calls_count + (1 if adding_tool_call else 0) > run.max_tool_calls
    ):
        return StopReason.BUDGET_EXHAUSTED
    if run.max_seconds is not None and run.started_at is not None:
        if (now - run.started_at).total_seconds() > run.max_seconds:
            return StopReason.TIMEOUT
    return ""


def run_enforce_budget(*, run_id: str) -> StopRequest | None:
    """Budget enforcer: a running run past its budget is stopped through the same stop path."""
    with transaction.atomic(durable=True):
        run = _lock_run(run_id)
        if run.status != RunStatus.RUNNING:
            return None
        now = timezone.now()
        reason = _budget_exceeded(run, now=now)
        if not reason:
            return None
        return _stop_locked(
            run, reason=reason, note="budget enforcer", actor=Actor.system("budget"), now=now
        )


def runs_over_budget_ids() -> list[str]:
    """Candidates for the budget enforcer (the enforcer re-checks each under its lock)."""
    running = Run.objects.filter(status=RunStatus.RUNNING).filter(
        Q(max_seconds__isnull=False) | Q(max_tool_calls__isnull=False)
    )
    now = timezone.now()
    ids = []
    for run in running.only(
        "id", "max_seconds", "max_tool_calls", "tool_calls_count", "started_at"
    ):
        if _budget_exceeded(run, now=now):
            ids.append(run.pk)
    return ids
