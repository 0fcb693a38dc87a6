"""The stop's writes in one round trip, as one statement built once per process.

A stop of a running run wrote its StopRequest, froze the outbox, flagged calls in flight,
marked steering, moved the run, then read the ledger head, the live lease and whether an
approval waits: nine ORM statements, each compiled again on every stop. Compiling them was most
of a stop's CPU time, which is what bounds a bulk stop of 1,000 runs (docs/BENCHMARKS.md,
"Bulk stop"). Here they are one statement: data-modifying CTEs, which PostgreSQL runs exactly
once each whether or not the outer query reads them, and reads of rows no CTE touches. It runs
after the run row is locked, in the stop's transaction, so what it reads is what the lock holds
still (READ COMMITTED takes a new snapshot per statement: after the lock was granted).

Column and table names come from the models' `_meta`, and the StopRequest INSERT names every
concrete field with its Django default, so a column added by a migration is written too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, models

from runs.ledger import EMPTY_CHAIN, ChainHead
from runs.models import (
    Approval,
    ApprovalStatus,
    ExecutionRecord,
    Lease,
    LedgerEntry,
    OutboxItem,
    OutboxStatus,
    RemoteCancelState,
    Run,
    SteeringMessage,
    SteeringStatus,
    StopRequest,
)
from runs.services._base import OPEN_EXECUTION_STATES

# What a stop changes on the run row, beside what `_touch` always bumps.
RUN_FIELDS = (
    "status",
    "stop_epoch",
    "stop_reason",
    "stop_requested_by",
    "stop_requested_at",
    "change_seq",
    "updated_at",
)


@dataclass(frozen=True)
class StopWritten:
    """What the statement wrote and read."""

    stop_request_id: int
    frozen: int
    approvals_waiting: bool
    ledger_head: ChainHead
    # The live lease's expiry, or None without a live lease.
    lease_expires_at: datetime | None


def _table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def _field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)  # a concrete column, not a reverse relation
    return field


def _quoted(field: models.Field[Any, Any]) -> str:
    assert field.column is not None
    return connection.ops.quote_name(field.column)


def _column(model: type[models.Model], name: str) -> str:
    return _quoted(_field(model, name))


def _insert_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [field for field in model._meta.concrete_fields if not field.primary_key]


def _set(model: type[models.Model], names: tuple[str, ...]) -> str:
    return ", ".join(f"{_column(model, name)} = %s" for name in names)


@functools.cache
def _statement() -> str:
    inserted = _insert_fields(StopRequest)
    stop_request = (
        f"INSERT INTO {_table(StopRequest)} "
        f"({', '.join(_quoted(field) for field in inserted)}) "
        f"VALUES ({', '.join(['%s'] * len(inserted))}) RETURNING {_column(StopRequest, 'id')}"
    )
    frozen = (
        f"UPDATE {_table(OutboxItem)} SET "
        f"{_set(OutboxItem, ('status', 'frozen_at', 'frozen_by_epoch', 'updated_at'))} "
        f"WHERE {_column(OutboxItem, 'run')} = %s AND {_column(OutboxItem, 'status')} = %s "
        "RETURNING 1"
    )
    calls = (
        f"UPDATE {_table(ExecutionRecord)} SET "
        f"{_set(ExecutionRecord, ('cancel_requested', 'remote_cancel_state'))} "
        f"WHERE {_column(ExecutionRecord, 'run')} = %s "
        f"AND {_column(ExecutionRecord, 'execution_state')} = ANY(%s)"
    )
    steering = (
        f"UPDATE {_table(SteeringMessage)} SET {_set(SteeringMessage, ('status',))} "
        f"WHERE {_column(SteeringMessage, 'run')} = %s "
        f"AND {_column(SteeringMessage, 'status')} = ANY(%s)"
    )
    moved = f"UPDATE {_table(Run)} SET {_set(Run, RUN_FIELDS)} WHERE {_column(Run, 'id')} = %s"
    waiting = (
        f"EXISTS (SELECT 1 FROM {_table(Approval)} WHERE {_column(Approval, 'run')} = %s "
        f"AND {_column(Approval, 'status')} = %s)"
    )
    head = (
        f"SELECT {_column(LedgerEntry, 'run_seq')} AS run_seq, {_column(LedgerEntry, 'hash')} "
        f"AS hash FROM {_table(LedgerEntry)} WHERE {_column(LedgerEntry, 'run')} = %s "
        f"ORDER BY {_column(LedgerEntry, 'run_seq')} DESC LIMIT 1"
    )
    lease = (
        f"SELECT {_column(Lease, 'expires_at')} AS expires_at FROM {_table(Lease)} "
        f"WHERE {_column(Lease, 'run')} = %s AND {_column(Lease, 'released_at')} IS NULL "
        "LIMIT 1"  # at most one: lease_one_live_per_run
    )
    return (
        f"WITH stop_request AS ({stop_request}), frozen AS ({frozen}), calls AS ({calls}), "
        f"steering AS ({steering}), moved AS ({moved}) "
        f"SELECT (SELECT {_column(StopRequest, 'id')} FROM stop_request), "
        f"(SELECT count(*) FROM frozen), {waiting}, "
        "head.run_seq, head.hash, lease.expires_at FROM (SELECT 1) AS one "
        f"LEFT JOIN LATERAL ({head}) AS head ON true "
        f"LEFT JOIN LATERAL ({lease}) AS lease ON true"
    )


def _prepared(model: type[models.Model], name: str, value: Any) -> Any:
    return _field(model, name).get_db_prep_save(value, connection)


def _params(run: Run, stop_request: StopRequest, *, now: datetime) -> list[Any]:
    params: list[Any] = [
        field.get_db_prep_save(field.pre_save(stop_request, True), connection)
        for field in _insert_fields(StopRequest)
    ]
    params += [
        OutboxStatus.FROZEN,
        _prepared(OutboxItem, "frozen_at", now),
        run.stop_epoch,
        _prepared(OutboxItem, "updated_at", now),
        run.pk,
        OutboxStatus.PENDING,
    ]
    params += [True, RemoteCancelState.REQUESTED, run.pk, list(OPEN_EXECUTION_STATES)]
    params += [
        SteeringStatus.UNAPPLIED_AT_STOP,
        run.pk,
        [SteeringStatus.QUEUED, SteeringStatus.CARRIED_OVER],
    ]
    params += [_prepared(Run, name, getattr(run, name)) for name in RUN_FIELDS]
    params += [run.pk]
    params += [run.pk, ApprovalStatus.WAITING, run.pk, run.pk]
    return params


def write_stop(run: Run, stop_request: StopRequest, *, now: datetime) -> StopWritten:
    """Insert `stop_request`, freeze the pending outbox, flag the calls in flight, mark queued
    steering unapplied, write the run's stop fields (already set on `run`); read back the
    StopRequest id, how many items froze, whether an approval waits, the ledger head and the
    live lease's expiry. Call it under the run lock, in the stop's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(_statement(), _params(run, stop_request, now=now))
        row = cursor.fetchone()
    stop_request_id, frozen, waiting, run_seq, digest, expires_at = row
    return StopWritten(
        stop_request_id=stop_request_id,
        frozen=frozen,
        approvals_waiting=waiting,
        ledger_head=ChainHead(run_seq, digest) if run_seq is not None else EMPTY_CHAIN,
        lease_expires_at=expires_at,
    )
