"""A tool result in two round trips: its opening, then its writes and its commit; statements built
once.

A result read its execution record, saved it (every column), read the ledger head, appended,
and bumped the run's counters: five ORM statements, each compiled again on every call, each a
round trip. The MCP gateway records one for every `tools/call`, and back to back an agent's
next permit waits for it (the session's lane keeps them in order), so compiling them was a
third of the gateway's CPU per call (docs/BENCHMARKS.md).

Here the opening is one pipeline (`runs.sql.pipelined`): BEGIN, the run lock, then — the lock
held, READ COMMITTED taking a new snapshot per statement — the record and the ledger head in
one statement, and the row the team's policies check against (`hooks.PolicyChecks.read`:
nothing the result writes is in it). The writes are a second pipeline: the record and the
run's counters in one statement, and the ledger entry, hashed beforehand, with the COMMIT when
the team never had a policy (whose facts the result would write after) and the run is not
`stopped_dirty` (which the result may settle). On SQLite
(`make run`) each read and write goes through the ORM, one by one.

No `pre_save`/`post_save` signal is sent for the record or the run: no receiver listens to
either (runs.sql).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from runs import sql
from runs.ledger import EMPTY_CHAIN, ChainHead, PendingEntry, chain_head
from runs.models import ExecutionRecord, LedgerEntry, Run
from runs.services._run_lock import lock_run_row, lock_with_read

# What a result changes on the run row (`_base.run_mark_changed`'s fields).
RUN_FIELDS = ("change_seq", "updated_at")


@dataclass(frozen=True)
class ResultReads:
    record: ExecutionRecord | None
    ledger_head: ChainHead


@functools.cache
def _read_statement() -> str:
    record = (
        f"SELECT {sql.select_columns(ExecutionRecord)} FROM {sql.table(ExecutionRecord)} "
        f"WHERE {sql.column(ExecutionRecord, 'run')} = %s "
        f"AND {sql.column(ExecutionRecord, 'tool_call_id')} = %s "
        # At most one: unique (run, tool_call_id); the ORM's `.first()` orders by the key.
        f"ORDER BY {sql.column(ExecutionRecord, 'id')} LIMIT 1"
    )
    head = (
        f"SELECT {sql.column(LedgerEntry, 'run_seq')} AS run_seq, "
        f"{sql.column(LedgerEntry, 'hash')} AS hash FROM {sql.table(LedgerEntry)} "
        f"WHERE {sql.column(LedgerEntry, 'run')} = %s "
        f"ORDER BY {sql.column(LedgerEntry, 'run_seq')} DESC LIMIT 1"
    )
    columns = ", ".join(
        f"record.{sql.quoted(field)}" for field in ExecutionRecord._meta.concrete_fields
    )
    return (
        f"SELECT {columns}, head.run_seq, head.hash FROM (SELECT 1) AS one "
        f"LEFT JOIN LATERAL ({record}) AS record ON true "
        f"LEFT JOIN LATERAL ({head}) AS head ON true"
    )


@dataclass(frozen=True)
class ResultOpening:
    run: Run
    reads: ResultReads
    # The row the team's policies check against (`hooks.PolicyChecks.read`); None: they read it.
    checks_read: Sequence[Any] | None


@contextmanager
def locked_run_for_result(run_id: str, *, tool_call_id: str) -> Iterator[ResultOpening]:
    """`_base.locked_run` for a tool's result: a durable transaction whose first query locks the
    run, with the call's record and the ledger head."""
    with transaction.atomic(durable=True):
        yield _open(run_id, tool_call_id=tool_call_id)


def _open(run_id: str, *, tool_call_id: str) -> ResultOpening:
    if not sql.prepared_statements():
        run = lock_run_row(run_id)
        reads = ResultReads(
            record=ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first(),
            ledger_head=chain_head(run),
        )
        return ResultOpening(run, reads, None)
    run, row, checks_read = lock_with_read(
        run_id, (_read_statement(), [run_id, tool_call_id, run_id])
    )
    width = len(ExecutionRecord._meta.concrete_fields)
    values, (run_seq, digest) = row[:width], row[width:]
    record = sql.from_row(ExecutionRecord, values) if values[0] is not None else None
    if record is not None:
        record.run = run  # the locked run, as `filter(run=run)` would not load it again
    reads = ResultReads(
        record=record,
        ledger_head=ChainHead(run_seq, digest) if run_seq is not None else EMPTY_CHAIN,
    )
    return ResultOpening(run, reads, checks_read)


def _record_fields() -> list[Any]:
    return sql.insert_fields(ExecutionRecord)  # every concrete column but the key


@functools.cache
def _write_statement() -> str:
    moved = sql.update_statement(Run, RUN_FIELDS)
    saved = (
        f"UPDATE {sql.table(ExecutionRecord)} SET "
        f"{', '.join(f'{sql.quoted(field)} = %s' for field in _record_fields())} "
        f"WHERE {sql.quoted(ExecutionRecord._meta.pk)} = %s"
    )
    return f"WITH moved AS ({moved}) {saved}"


def write_result(
    run: Run, record: ExecutionRecord, *, entry: PendingEntry | None, commit: bool = False
) -> None:
    """Save every column of `record` (as `record.save()` does) and the run's `change_seq` (already
    bumped on `run`) with its `updated_at`, with the result's ledger `entry` in the same round
    trip. Call it under the run lock, in the result's transaction. `commit`: the caller writes
    nothing after these; the COMMIT may go in the same round trip (`sql.pipelined`), unless a
    ledger listener writes for the entry."""
    if not sql.prepared_statements():
        record.save()
        run.save(update_fields=list(RUN_FIELDS))
        return
    params = [
        sql.field_of(Run, name).get_db_prep_save(
            sql.field_of(Run, name).pre_save(run, False), connection
        )
        for name in RUN_FIELDS
    ]
    params.append(run.pk)
    params += [
        field.get_db_prep_save(field.pre_save(record, False), connection)
        for field in _record_fields()
    ]
    params.append(record.pk)
    _written, *entries = sql.pipelined(
        (_write_statement(), params),
        *([entry.statement()] if entry else []),
        commit=commit and not (entry and entry.listened),
    )
    if entry is not None:
        entry.written(entries[0][0][0])
