"""The stop's writes in one round trip, as one statement built once per process.

A stop of a running run writes its StopRequest, flags calls in flight, marks steering, moves
the run (its new epoch freezes the pending outbox: `runs.frozen`), then reads how many items
that froze (bounded), the ledger head, the live lease and whether an approval waits. These were
nine ORM statements, each compiled again on every stop. Compiling them was most
of a stop's CPU time, which is what bounds a bulk stop of 1,000 runs (docs/BENCHMARKS.md).
Here they are one statement: data-modifying CTEs, which PostgreSQL runs exactly
once each whether or not the outer query reads them, and reads of rows no CTE touches. It runs
after the run row is locked, in the stop's transaction, so what it reads is what the lock holds
still (READ COMMITTED takes a new snapshot per statement: after the lock was granted).

Column and table names come from the models' `_meta` (`runs.sql`), and the StopRequest INSERT
names every concrete field with its Django default, so a column added by a migration is written
too. On SQLite (`make run`) the same writes and reads go through the ORM, one by one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Case, F, Value, When

from runs import sql
from runs.ledger import EMPTY_CHAIN, RUN_CHAIN_HEAD, ChainHead, chain_head, chain_head_from
from runs.models import (
    Approval,
    ApprovalStatus,
    ExecutionRecord,
    ExecutionState,
    Lease,
    LedgerEntry,
    OutboxItem,
    OutboxStatus,
    RemoteCancelState,
    Run,
    SideEffect,
    SideEffectState,
    SteeringMessage,
    SteeringStatus,
    StopRequest,
)
from runs.selectors import DIRTY_REASONS_READ, dirty_reasons_from, run_dirty_reasons
from runs.services._base import (
    CURRENT_STOP_REQUEST,
    LEASE_BY_TOKEN,
    LIVE_LEASE,
    OPEN_EXECUTION_STATES,
    live_lease,
)
from runs.services._run_lock import lock_run_row, run_from_lock_row, run_lock_statement

# What a stop changes on the run row, beside what `_bump_change_seq` always bumps.
RUN_FIELDS = (
    "status",
    "stop_epoch",
    "stop_reason",
    "stop_requested_by",
    "stop_requested_at",
    "change_seq",
    "updated_at",
)
STEERING_UNAPPLIED_AT_STOP = (SteeringStatus.QUEUED, SteeringStatus.CARRIED_OVER)
# The stop counts the items its epoch froze up to this many (the ledger says "more" beyond).
FROZEN_COUNT_CAP = 1000


@dataclass(frozen=True)
class StopWritten:
    """What the statement wrote and read."""

    stop_request_id: int
    # Pending items the new epoch froze, counted up to FROZEN_COUNT_CAP + 1 (a bounded read:
    # the stop's commit must not grow with the queue). More than the cap reads as the cap + 1.
    frozen: int
    approvals_waiting: bool
    ledger_head: ChainHead
    # The live lease's expiry, or None without a live lease.
    lease_expires_at: datetime | None


# --------------------------------------------------------------------------------------------
# the run lock


@dataclass(frozen=True)
class DrainOpening:
    run: Run
    # The lease the worker names (None: not this run's), and the run's current stop request.
    lease: Lease | None
    stop_request: StopRequest | None
    ledger_head: ChainHead


@contextmanager
def locked_run_for_drain(run_id: str, lease_token: str) -> Iterator[DrainOpening]:
    """`locked_run_for_stop` for the worker's drained answer: with its first reads."""
    with transaction.atomic(durable=True):
        yield _lock_run_for_drain(run_id, lease_token)


def _lock_run_for_drain(run_id: str, lease_token: str) -> DrainOpening:
    """The first query of the drained answer's transaction, the run lock, then (the lock held, so
    each read is a fresh snapshot) the lease the worker names and the run's current stop
    request and the ledger head: one round trip on PostgreSQL, BEGIN included."""
    if not sql.prepared_statements():
        run = lock_run_row(run_id)
        return DrainOpening(
            run,
            LEASE_BY_TOKEN.first(run_id, lease_token),
            CURRENT_STOP_REQUEST.first(run_id),
            chain_head(run),
        )
    locked, lease, stop_request, head = sql.pipelined(
        (run_lock_statement(), [run_id]),
        LEASE_BY_TOKEN.statement(run_id, lease_token),
        CURRENT_STOP_REQUEST.statement(run_id),
        RUN_CHAIN_HEAD.statement(run_id),
    )
    return DrainOpening(
        run_from_lock_row(run_id, locked[0] if locked else None),
        LEASE_BY_TOKEN.instance(LEASE_BY_TOKEN.converted(lease)),
        CURRENT_STOP_REQUEST.instance(CURRENT_STOP_REQUEST.converted(stop_request)),
        chain_head_from(RUN_CHAIN_HEAD.converted(head)),
    )


@dataclass(frozen=True)
class AckOpening:
    run: Run
    stop_request: StopRequest | None
    ledger_head: ChainHead


@contextmanager
def locked_run_for_ack(run_id: str) -> Iterator[AckOpening]:
    """`locked_run_for_stop` for the worker's ack: the lock, the current stop request and the
    ledger head in one round trip on PostgreSQL, BEGIN included. A worker that drains at once
    sends its `drained` a few milliseconds after its ack, and the drained answer waits for the
    run lock the ack holds: every round trip of the ack is one of the drained answer's."""
    with transaction.atomic(durable=True):
        if not sql.prepared_statements():
            run = lock_run_row(run_id)
            yield AckOpening(run, CURRENT_STOP_REQUEST.first(run_id), chain_head(run))
            return
        locked, stop_request, head = sql.pipelined(
            (run_lock_statement(), [run_id]),
            CURRENT_STOP_REQUEST.statement(run_id),
            RUN_CHAIN_HEAD.statement(run_id),
        )
        yield AckOpening(
            run_from_lock_row(run_id, locked[0] if locked else None),
            CURRENT_STOP_REQUEST.instance(CURRENT_STOP_REQUEST.converted(stop_request)),
            chain_head_from(RUN_CHAIN_HEAD.converted(head)),
        )


@contextmanager
def locked_run_for_stop(run_id: str) -> Iterator[Run]:
    """`_base.locked_run` with its lock query built once: a durable transaction whose first
    query locks the run."""
    with transaction.atomic(durable=True):
        yield lock_run_row(run_id)


# --------------------------------------------------------------------------------------------
# the stop's writes


@functools.cache
def _statement() -> str:
    stop_request = sql.insert_statement(StopRequest)
    # Not an UPDATE of every pending row: the run's new epoch freezes them (`runs.frozen`).
    # What is read is bounded, through `outbox_pending_run_idx`.
    frozen = (
        f"SELECT 1 FROM {sql.table(OutboxItem)} WHERE {sql.column(OutboxItem, 'run')} = %s "
        f"AND {sql.column(OutboxItem, 'status')} = %s "
        f"AND {sql.column(OutboxItem, 'enqueue_epoch')} >= %s LIMIT %s"
    )
    calls = (
        f"UPDATE {sql.table(ExecutionRecord)} SET "
        f"{_set(ExecutionRecord, ('cancel_requested', 'remote_cancel_state'))} "
        f"WHERE {sql.column(ExecutionRecord, 'run')} = %s "
        f"AND {sql.column(ExecutionRecord, 'execution_state')} = ANY(%s)"
    )
    steering = (
        f"UPDATE {sql.table(SteeringMessage)} SET {_set(SteeringMessage, ('status',))} "
        f"WHERE {sql.column(SteeringMessage, 'run')} = %s "
        f"AND {sql.column(SteeringMessage, 'status')} = ANY(%s)"
    )
    moved = (
        f"UPDATE {sql.table(Run)} SET {_set(Run, RUN_FIELDS)} WHERE {sql.column(Run, 'id')} = %s"
    )
    waiting = (
        f"EXISTS (SELECT 1 FROM {sql.table(Approval)} WHERE {sql.column(Approval, 'run')} = %s "
        f"AND {sql.column(Approval, 'status')} = %s)"
    )
    head = (
        f"SELECT {sql.column(LedgerEntry, 'run_seq')} AS run_seq, "
        f"{sql.column(LedgerEntry, 'hash')} AS hash FROM {sql.table(LedgerEntry)} "
        f"WHERE {sql.column(LedgerEntry, 'run')} = %s "
        f"ORDER BY {sql.column(LedgerEntry, 'run_seq')} DESC LIMIT 1"
    )
    lease = (
        f"SELECT {sql.column(Lease, 'expires_at')} AS expires_at FROM {sql.table(Lease)} "
        f"WHERE {sql.column(Lease, 'run')} = %s AND {sql.column(Lease, 'released_at')} IS NULL "
        "LIMIT 1"  # at most one: lease_one_live_per_run
    )
    return (
        f"WITH stop_request AS ({stop_request}), calls AS ({calls}), "
        f"steering AS ({steering}), moved AS ({moved}), frozen AS ({frozen}) "
        f"SELECT (SELECT {sql.quoted(StopRequest._meta.pk)} FROM stop_request), "
        f"(SELECT count(*) FROM frozen), {waiting}, "
        "head.run_seq, head.hash, lease.expires_at FROM (SELECT 1) AS one "
        f"LEFT JOIN LATERAL ({head}) AS head ON true "
        f"LEFT JOIN LATERAL ({lease}) AS lease ON true"
    )


def _set(model: Any, names: tuple[str, ...]) -> str:
    return ", ".join(f"{sql.column(model, name)} = %s" for name in names)


def _prepared(model: Any, name: str, value: Any) -> Any:
    return sql.field_of(model, name).get_db_prep_save(value, connection)


def _params(run: Run, stop_request: StopRequest, *, now: datetime) -> list[Any]:
    params = sql.insert_params(stop_request)
    params += [True, RemoteCancelState.REQUESTED, run.pk, list(OPEN_EXECUTION_STATES)]
    params += [SteeringStatus.UNAPPLIED_AT_STOP, run.pk, list(STEERING_UNAPPLIED_AT_STOP)]
    params += [_prepared(Run, name, getattr(run, name)) for name in RUN_FIELDS]
    params += [run.pk]
    params += [run.pk, OutboxStatus.PENDING, stop_request.epoch_before, FROZEN_COUNT_CAP + 1]
    params += [run.pk, ApprovalStatus.WAITING, run.pk, run.pk]
    return params


def write_stop(run: Run, stop_request: StopRequest, *, now: datetime) -> StopWritten:
    """Insert `stop_request` (its pk is set), flag the calls in flight, mark queued steering
    unapplied, write the run's stop fields (already set on `run`: its new epoch freezes the
    pending outbox, relabelled later by `outbox_relabel_frozen`); read back how many items froze
    (bounded), whether an approval waits, the ledger head and the live lease's expiry. Call it
    under the run lock, in the stop's transaction."""
    if not sql.prepared_statements():
        return _write_stop_with_the_orm(run, stop_request, now=now)
    with connection.cursor() as cursor:
        cursor.execute(_statement(), _params(run, stop_request, now=now))
        row = cursor.fetchone()
    stop_request_id, frozen, waiting, run_seq, digest, expires_at = row
    sql.saved_as(stop_request, stop_request_id)
    return StopWritten(
        stop_request_id=stop_request_id,
        frozen=frozen,
        approvals_waiting=waiting,
        ledger_head=ChainHead(run_seq, digest) if run_seq is not None else EMPTY_CHAIN,
        lease_expires_at=expires_at,
    )


def _write_stop_with_the_orm(run: Run, stop_request: StopRequest, *, now: datetime) -> StopWritten:
    """The same writes and reads, one ORM statement each (SQLite)."""
    stop_request.save(force_insert=True)
    frozen = len(
        OutboxItem.objects.filter(
            run=run, status=OutboxStatus.PENDING, enqueue_epoch__gte=stop_request.epoch_before
        ).values_list("pk", flat=True)[: FROZEN_COUNT_CAP + 1]
    )
    ExecutionRecord.objects.filter(run=run, execution_state__in=OPEN_EXECUTION_STATES).update(
        cancel_requested=True, remote_cancel_state=RemoteCancelState.REQUESTED
    )
    SteeringMessage.objects.filter(run=run, status__in=STEERING_UNAPPLIED_AT_STOP).update(
        status=SteeringStatus.UNAPPLIED_AT_STOP
    )
    run.save(update_fields=list(RUN_FIELDS))
    lease = live_lease(run)
    return StopWritten(
        stop_request_id=stop_request.pk,
        frozen=frozen,
        approvals_waiting=Approval.objects.filter(run=run, status=ApprovalStatus.WAITING).exists(),
        ledger_head=chain_head(run),
        lease_expires_at=lease.expires_at if lease is not None else None,
    )


# --------------------------------------------------------------------------------------------
# the settle's calls in flight


@functools.cache
def _unknown_statement() -> str:
    state = sql.column(ExecutionRecord, "side_effect_state")
    return (
        f"UPDATE {sql.table(ExecutionRecord)} SET "
        f"{_set(ExecutionRecord, ('execution_state', 'observed_at', 'observation_source'))}, "
        f"{state} = CASE WHEN {sql.column(ExecutionRecord, 'side_effect')} = %s THEN %s "
        f"ELSE {state} END "
        f"WHERE {sql.column(ExecutionRecord, 'run')} = %s "
        f"AND {sql.column(ExecutionRecord, 'execution_state')} = ANY(%s)"
    )


@dataclass(frozen=True)
class Settling:
    """What a settle reads once the calls in flight are `unknown`."""

    lease: Lease | None
    # `run_dirty_reasons` as the run stands before the live lease (if any) is released.
    dirty_reasons: list[str]
    ledger_head: ChainHead


def settle_open_calls(run: Run, *, now: datetime, after: sql.Deferred) -> Settling:
    """The writes `after` holds back (the drained answer's), `mark_open_calls_unknown`, then the
    live lease, the dirty reasons and the ledger head: one round trip on PostgreSQL, in that
    order (a pipeline's statements each see what the ones before wrote)."""
    if not sql.prepared_statements():
        after.send()
        mark_open_calls_unknown(run, now=now, source="stop")
        return Settling(live_lease(run), run_dirty_reasons(run), chain_head(run))
    _marked, lease, reasons, head = after.pipelined(
        (_unknown_statement(), _unknown_params(run, now=now, source="stop")),
        LIVE_LEASE.statement(run.pk),
        DIRTY_REASONS_READ.statement(run.pk),
        RUN_CHAIN_HEAD.statement(run.pk),
    )
    return Settling(
        LIVE_LEASE.instance(LIVE_LEASE.converted(lease)),
        dirty_reasons_from(DIRTY_REASONS_READ.converted(reasons)),
        chain_head_from(RUN_CHAIN_HEAD.converted(head)),
    )


def mark_open_calls_unknown(run: Run, *, now: datetime, source: str) -> int:
    """Calls still permitted or running whose result never arrived become `unknown` (never
    retried, never assumed failed); a write's side effect awaits verification. One UPDATE, not
    a read of every open call and a save each; returns how many. Call it under the run lock."""
    if not sql.prepared_statements():
        return ExecutionRecord.objects.filter(
            run=run, execution_state__in=OPEN_EXECUTION_STATES
        ).update(
            execution_state=ExecutionState.UNKNOWN,
            observed_at=now,
            observation_source=source,
            side_effect_state=Case(
                When(
                    side_effect=SideEffect.WRITE, then=Value(SideEffectState.PENDING_VERIFICATION)
                ),
                default=F("side_effect_state"),
            ),
        )
    with connection.cursor() as cursor:
        cursor.execute(_unknown_statement(), _unknown_params(run, now=now, source=source))
        return int(cursor.rowcount)


def _unknown_params(run: Run, *, now: datetime, source: str) -> list[Any]:
    return [
        ExecutionState.UNKNOWN,
        _prepared(ExecutionRecord, "observed_at", now),
        source,
        SideEffect.WRITE,
        SideEffectState.PENDING_VERIFICATION,
        run.pk,
        list(OPEN_EXECUTION_STATES),
    ]
