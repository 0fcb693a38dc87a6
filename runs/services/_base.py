"""The mechanics every transition shares: the transition table, the run lock, the status move
with its ledger entry and notification, the entrance check, and the lease and tool-result
helpers several record families use. The names here are public to `runs.services` and to code
outside runs that writes under the run lock (handoff's own transitions: `locked_run`,
`run_move`, `run_mark_changed`).

Lock order everywhere: run, then its children (lease, execution records, outbox items).

Opening a locked run. Every transition runs in a durable transaction whose first statement
locks the run row (`FOR NO KEY UPDATE`), so two transitions on one run are serialised. There are
four ways in, one per path whose statement count matters; each takes the same lock, on the same
row, as the first statement of its own durable transaction:

1. `locked_run(run_id)`: `lock_run_row` (the run and its team; on PostgreSQL the ORM's query
   built once per process, `run_lock_statement`: compiling it was a fifth of an MCP tool call's
   CPU and most of a bulk stop's). Every transition but the three below, and handoff's own.
2. the stop: `_stop_sql.locked_run_for_stop`, the same lock in a transaction of its own; the
   worker's acknowledgement opens the same way, and its drained answer with
   `_stop_sql.locked_run_for_drain`: the lock, the lease it names, the current stop request
   and the ledger head in one round trip.
3. the events batch: `_events_sql.open_batch` sends the lock (the run's columns a batch reads,
   with the caller's token re-checked in the same statement) in one pipeline with the batch's
   receipts and steps, then builds the run from the row.
4. a tool call's permit and its result: `_permit_sql.locked_run_for_permit` and
   `_result_sql.locked_run_for_result` send the lock in one pipeline with what each decides on
   (the lease, the retry, the step, the rules and the ledger head; the record and the head) and
   the row the team's policies check against.

The lock's statement and the run built from its row are in `_run_lock`, which the openings of
2–4 import.

On a database other than PostgreSQL (`runs.sql.prepared_statements()` is false: the embedded
SQLite), 2–4 fall back to `lock_run_row` and the ORM.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F

from runs import notify, sql
from runs.actors import Actor
from runs.errors import (
    IllegalTransition,
    NotFound,
    RunNotRunning,
    StaleEpoch,
)
from runs.ledger import ChainHead, ledger_append, ledger_entry_pending
from runs.models import (
    OUTBOX_IN_FLIGHT_STATUSES,
    ExecutionRecord,
    ExecutionState,
    Lease,
    RejectedWrite,
    Run,
    RunStatus,
    SideEffect,
    SideEffectState,
    StopRequest,
)
from runs.services._result_sql import write_result
from runs.services._run_lock import lock_run_row

OPEN_EXECUTION_STATES = (ExecutionState.PERMITTED, ExecutionState.RUNNING)
IN_FLIGHT_OUTBOX = OUTBOX_IN_FLIGHT_STATUSES

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
    # → running: a lease on a run its worker suspended to wait for reviewers (same epoch).
    RunStatus.SUSPENDED: frozenset(
        {RunStatus.PENDING, RunStatus.RUNNING, RunStatus.CANCEL_REQUESTED}
    ),
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


@contextmanager
def locked_run(run_id: str) -> Iterator[Run]:
    """The opening of every transition: a durable transaction whose first query locks the run.

    Durable, so no caller can wrap a transition in a longer transaction and hold the lock (or
    delay the commit that publishes the change) past the transition itself.
    """
    with transaction.atomic(durable=True):
        yield lock_run_row(run_id)


def _bump_change_seq(run: Run, *fields: str) -> None:
    # Safe as a Python increment: every caller holds the run row lock.
    run.change_seq += 1
    sql.save_fields(run, (*fields, "change_seq", "updated_at"))


def run_move(
    run: Run,
    to: str,
    *,
    actor: Actor,
    action: str,
    reason: str = "",
    payload: dict[str, Any] | None = None,
    fields: tuple[str, ...] = (),
    head: ChainHead | None = None,
    writes: sql.Deferred | None = None,
) -> None:
    """Change status (checked against TRANSITIONS), ledger it, and notify on commit.

    `head`: the run chain's head when the caller has read it under the same lock
    (`ledger_append`; an entry this run object appended since still wins). `writes`: hold the
    run's UPDATE and the entry's INSERT back, to go in the round trip of the caller's next
    statements (`runs.sql.Deferred`)."""
    before = run.status
    if to not in TRANSITIONS[before]:
        raise IllegalTransition.for_run(run, f"a {before} run cannot move to {to}")
    run.status = to
    entry_payload = {"from": before, "to": to, "stop_epoch": run.stop_epoch, **(payload or {})}
    if writes is None:
        _bump_change_seq(run, "status", *fields)
        ledger_append(
            run=run, actor=actor, action=action, reason=reason, payload=entry_payload, head=head
        )
    else:
        # Safe as a Python increment: every caller holds the run row lock.
        run.change_seq += 1
        writes.save_fields(run, ("status", *fields, "change_seq", "updated_at"))
        _ledger_append_held(
            writes,
            run=run,
            actor=actor,
            action=action,
            reason=reason,
            payload=entry_payload,
            head=head,
        )
    notify.run_changed(run, kind=action)


def _ledger_append_held(
    writes: sql.Deferred,
    *,
    run: Run,
    actor: Actor,
    action: str,
    reason: str,
    payload: dict[str, Any],
    head: ChainHead | None,
) -> None:
    """`ledger_append`, its INSERT held back in `writes`."""
    entry = ledger_entry_pending(
        run=run, actor=actor, action=action, reason=reason, payload=payload, head=head
    )
    if entry is None:  # through the ORM, now
        ledger_append(
            run=run, actor=actor, action=action, reason=reason, payload=payload, head=head
        )
        return
    # The chain's next entry links to this one though it is not written yet: both INSERTs are
    # held in order, and the run lock keeps every other writer off the chain meanwhile.
    run._ledger_appended = ChainHead(entry.entry.run_seq, entry.entry.hash)  # type: ignore[attr-defined]
    writes.add(entry.statement(), then=lambda rows: entry.written(rows[0][0]))


def run_mark_changed(run: Run, *, kind: str, fields: tuple[str, ...] = (), **extra: Any) -> None:
    """A change to the run's children (no status change): bump the sequence and notify
    (`extra` goes into the notification)."""
    _bump_change_seq(run, *fields)
    notify.run_changed(run, kind=kind, **extra)


def _record_rejected_write(run: Run, *, kind: str, epoch: int, code: str) -> None:
    """Stale-epoch writes are refused *and counted* (stop-quality figure: late writes)."""
    RejectedWrite.objects.create(
        run=run, kind=kind, epoch=epoch, run_epoch=run.stop_epoch, code=code
    )
    Run.objects.filter(pk=run.pk).update(late_writes_rejected=F("late_writes_rejected") + 1)


def reject_late_write(
    run_id: str, *, kind: str, epoch: int, error: StaleEpoch | RunNotRunning
) -> None:
    """Count a refused write in its own short transaction, then raise the refusal."""
    if isinstance(error, StaleEpoch):
        with transaction.atomic():
            run = Run.objects.select_for_update(no_key=True).get(pk=run_id)
            _record_rejected_write(run, kind=kind, epoch=epoch, code=error.code)
    raise error


# The reads every stop transition makes under the run lock, compiled once per process
# (`runs.sql.OnceCompiledInstance`); the sample stands for a run id while they compile.
_SAMPLE_RUN = "run_sample_5afe"
_SAMPLE_TOKEN = "lease_token_sample_5afe"
LIVE_LEASE = sql.OnceCompiledInstance(
    Lease,
    lambda run_id: Lease.objects.filter(run_id=run_id, released_at__isnull=True).order_by("pk"),
    _SAMPLE_RUN,
)
LEASE_BY_TOKEN = sql.OnceCompiledInstance(
    Lease,
    lambda run_id, token: Lease.objects.filter(run_id=run_id, token=token).order_by("pk"),
    _SAMPLE_RUN,
    _SAMPLE_TOKEN,
)
CURRENT_STOP_REQUEST = sql.OnceCompiledInstance(
    StopRequest,
    lambda run_id: StopRequest.objects.filter(run_id=run_id).order_by("-epoch_after"),
    _SAMPLE_RUN,
)


def live_lease(run: Run) -> Lease | None:
    lease: Lease | None = LIVE_LEASE.first(run.pk)
    return lease


def _lease_is_current(lease: Lease | None, run: Run, now: datetime) -> bool:
    return lease is not None and lease.epoch == run.stop_epoch and lease.expires_at > now


_UNREAD: Any = object()


def check_work_may_start(
    run: Run, epoch: int, *, now: datetime, lease: Lease | None = _UNREAD
) -> StaleEpoch | RunNotRunning | None:
    """The entrance: only a running run, at its current epoch, with a live current lease.

    `lease`: the run's live lease when the caller has just read it under the same lock."""
    if epoch != run.stop_epoch:
        return StaleEpoch.for_run(
            run, f"epoch {epoch} is not the run's current epoch {run.stop_epoch}"
        )
    if run.status != RunStatus.RUNNING:
        return RunNotRunning.for_run(run, f"the run is {run.status}; no new work may start")
    if lease is _UNREAD:
        lease = live_lease(run)
    if not _lease_is_current(lease, run, now):
        return RunNotRunning.for_run(run, "the run has no live lease at this epoch")
    return None


def release_lease(
    lease: Lease,
    *,
    reason: str,
    now: datetime,
    fenced: bool = False,
    writes: sql.Deferred | None = None,
) -> None:
    """`writes`: hold the UPDATE back (`runs.sql.Deferred`)."""
    lease.released_at = now
    lease.release_reason = reason
    lease.fenced_unconfirmed = fenced
    fields = ("released_at", "release_reason", "fenced_unconfirmed")
    if writes is None:
        sql.save_fields(lease, fields)
    else:
        writes.save_fields(lease, fields)


def find_lease(run: Run, lease_token: str) -> Lease:
    return lease_found(run, lease_token, LEASE_BY_TOKEN.first(run.pk, lease_token))


def lease_found(run: Run, lease_token: str, lease: Lease | None) -> Lease:
    """The lease `lease_token` names, as read under the run lock, or the refusal."""
    if lease is None:
        raise NotFound(f"lease {lease_token} does not belong to run {run.pk}")
    return lease


def current_stop_request(run: Run) -> StopRequest:
    stop_request: StopRequest | None = CURRENT_STOP_REQUEST.first(run.pk)
    if stop_request is None:
        raise IllegalTransition.for_run(run, "the run has no stop request")
    return stop_request


RESULT_STATES = {
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


def apply_tool_result(
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
    now: datetime,
    ledger_head: ChainHead | None = None,
    last_write: bool = False,
) -> None:
    """Record a reported outcome on `record` under the run lock. `ledger_head`: the run chain's
    head when the caller has just read it under the same lock (`_result_sql.locked_run_for_result`).
    `last_write`: the caller writes nothing after this; its COMMIT may go with these writes."""
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
            head=ledger_head,
        )
        run_mark_changed(run, kind="tool.result")
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
    # Safe as a Python increment: the caller holds the run row lock.
    run.change_seq += 1
    payload = {
        "tool_call_id": record.tool_call_id,
        "reported": execution_state,
        "kept": record.execution_state,
        "reported_after_stop": after_stop,
        "side_effect_state": record.side_effect_state,
    }
    entry = ledger_entry_pending(
        run=run, actor=actor, action="tool.result", payload=payload, head=ledger_head
    )
    # The record and the run's counters in one statement, with the entry in one round trip.
    write_result(run, record, entry=entry, commit=last_write)
    if entry is None:
        ledger_append(run=run, actor=actor, action="tool.result", payload=payload, head=ledger_head)
    notify.run_changed(run, kind="tool.result")
