"""A permit in two round trips: its opening, then its writes and its commit; statements built once.

A permit read the live lease, looked for a record of the same `tool_call_id`, read the team's
approval rules, found the running step, inserted the record, bumped the run's counters, read
the ledger head and appended: nine ORM statements, each compiled again on every call, each a
round trip. Every tool call an agent makes through the MCP gateway waits for its permit, so
those round trips were most of what the gateway added to a call (docs/BENCHMARKS.md).

Here the opening is one pipeline (`runs.sql.pipelined`): BEGIN, the run lock, then — the lock
held, and READ COMMITTED taking a new snapshot per statement — the permit's reads in one
statement and the row the team's policies check against (`hooks.PolicyChecks.read`). The
writes are a second pipeline: the record with the run's counters in one statement, and the
ledger entry, hashed beforehand (`runs.ledger.ledger_entry_pending`), and the COMMIT, unless the
call is held (its approval is written after). Rules are only read in
full when the team has an enabled one, the team's spend only when it has a budget, and a
`tool_call_id` asked before takes the ORM path (a retry is rare).
On SQLite (`make run`) each read and write goes through the ORM, one by one.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from runs import sql
from runs.ledger import EMPTY_CHAIN, ChainHead, PendingEntry, chain_head
from runs.models import (
    ApprovalRule,
    ExecutionRecord,
    Lease,
    LedgerEntry,
    Run,
    Step,
    StepStatus,
    TeamBudget,
)
from runs.services._base import live_lease
from runs.services._run_lock import lock_run_row, lock_with_read

# What a permit changes on the run row.
RUN_FIELDS = ("tool_calls_count", "change_seq", "updated_at")


@dataclass(frozen=True)
class PermitReads:
    lease: Lease | None
    asked_before: bool
    step_id: int | None
    rules_exist: bool
    ledger_head: ChainHead
    # The team has a daily or monthly budget: only then is its spend read (`team_budget_refusal`).
    team_budget_set: bool


@functools.cache
def _read_statement() -> str:
    # The run's team from its row, so that the statement needs the run's id alone: it is sent
    # with the run lock, before the run is known.
    team = (
        f"SELECT {sql.column(Run, 'team')} FROM {sql.table(Run)} WHERE {sql.column(Run, 'id')} = %s"
    )
    lease = (
        f"SELECT {sql.select_columns(Lease)} FROM {sql.table(Lease)} "
        f"WHERE {sql.column(Lease, 'run')} = %s AND {sql.column(Lease, 'released_at')} IS NULL "
        f"ORDER BY {sql.column(Lease, 'id')} LIMIT 1"  # at most one: lease_one_live_per_run
    )
    asked = (
        f"EXISTS (SELECT 1 FROM {sql.table(ExecutionRecord)} "
        f"WHERE {sql.column(ExecutionRecord, 'run')} = %s "
        f"AND {sql.column(ExecutionRecord, 'tool_call_id')} = %s)"
    )
    step = (
        f"(SELECT {sql.column(Step, 'id')} FROM {sql.table(Step)} "
        f"WHERE {sql.column(Step, 'run')} = %s AND {sql.column(Step, 'status')} = %s "
        f"ORDER BY {sql.column(Step, 'seq')} DESC LIMIT 1)"
    )
    rules = (
        f"EXISTS (SELECT 1 FROM {sql.table(ApprovalRule)} "
        f"WHERE {sql.column(ApprovalRule, 'team')} = ({team}) "
        f"AND {sql.column(ApprovalRule, 'enabled')})"
    )
    budget = (
        f"EXISTS (SELECT 1 FROM {sql.table(TeamBudget)} "
        f"WHERE {sql.column(TeamBudget, 'team')} = ({team}) "
        f"AND ({sql.column(TeamBudget, 'daily_usd')} IS NOT NULL "
        f"OR {sql.column(TeamBudget, 'monthly_usd')} IS NOT NULL))"
    )
    head = (
        f"SELECT {sql.column(LedgerEntry, 'run_seq')} AS run_seq, "
        f"{sql.column(LedgerEntry, 'hash')} AS hash FROM {sql.table(LedgerEntry)} "
        f"WHERE {sql.column(LedgerEntry, 'run')} = %s "
        f"ORDER BY {sql.column(LedgerEntry, 'run_seq')} DESC LIMIT 1"
    )
    lease_columns = ", ".join(f"lease.{sql.quoted(field)}" for field in Lease._meta.concrete_fields)
    return (
        f"SELECT {lease_columns}, {asked}, {step}, {rules}, {budget}, head.run_seq, head.hash "
        "FROM (SELECT 1) AS one "
        f"LEFT JOIN LATERAL ({lease}) AS lease ON true "
        f"LEFT JOIN LATERAL ({head}) AS head ON true"
    )


@dataclass(frozen=True)
class PermitOpening:
    run: Run
    reads: PermitReads
    # The row the team's policies check against (`hooks.PolicyChecks.read`); None: they read it.
    checks_read: Sequence[Any] | None


@contextmanager
def locked_run_for_permit(
    run_id: str, *, tool_call_id: str, step_key: str
) -> Iterator[PermitOpening]:
    """`_base.locked_run` for a permit: a durable transaction whose first query locks the run,
    with what the permit decides on."""
    with transaction.atomic(durable=True):
        yield _open(run_id, tool_call_id=tool_call_id, step_key=step_key)


def _open(run_id: str, *, tool_call_id: str, step_key: str) -> PermitOpening:
    if not sql.prepared_statements() or step_key:
        run = lock_run_row(run_id)
        return PermitOpening(
            run, _read_with_the_orm(run, tool_call_id=tool_call_id, step_key=step_key), None
        )
    # In the statement's order: the columns' subqueries, then the lease's and the head's joins.
    params = [run_id, tool_call_id, run_id, StepStatus.RUNNING, run_id, run_id, run_id, run_id]
    run, row, checks_read = lock_with_read(run_id, (_read_statement(), params))
    width = len(Lease._meta.concrete_fields)
    lease_values, (asked, step_id, rules, budget, run_seq, digest) = row[:width], row[width:]
    reads = PermitReads(
        lease=sql.from_row(Lease, lease_values) if lease_values[0] is not None else None,
        asked_before=asked,
        step_id=step_id,
        rules_exist=rules,
        ledger_head=ChainHead(run_seq, digest) if run_seq is not None else EMPTY_CHAIN,
        team_budget_set=budget,
    )
    return PermitOpening(run, reads, checks_read)


def _read_with_the_orm(run: Run, *, tool_call_id: str, step_key: str) -> PermitReads:
    steps = Step.objects.filter(run=run)
    step = (
        steps.filter(key=step_key)
        if step_key
        else steps.filter(status=StepStatus.RUNNING).order_by("-seq")
    )
    return PermitReads(
        lease=live_lease(run),
        asked_before=ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).exists(),
        step_id=step.values_list("pk", flat=True).first(),
        rules_exist=ApprovalRule.objects.filter(team_id=run.team_id, enabled=True).exists(),
        ledger_head=chain_head(run),
        team_budget_set=True,  # `team_budget_refusal` reads it, as it always did
    )


@functools.cache
def _write_statement() -> str:
    moved = sql.update_statement(Run, RUN_FIELDS)
    return f"WITH moved AS ({moved}) {sql.insert_statement(ExecutionRecord)}"


def write_permit(
    run: Run,
    record: ExecutionRecord,
    *,
    now: datetime,
    entry: PendingEntry | None,
    commit: bool = False,
) -> None:
    """Insert `record` (its pk is set) and write the run's counters (already set on `run`,
    but for `updated_at`, set here), with the permit's ledger `entry` in the same round trip.
    Call it under the run lock, in the permit's transaction. `commit`: the caller writes nothing
    after these; the COMMIT may go in the same round trip (`sql.pipelined`), unless a ledger
    listener writes for the entry."""
    run.updated_at = now
    if not sql.prepared_statements():
        record.save(force_insert=True)
        run.save(update_fields=list(RUN_FIELDS))
        return
    params = [
        sql.field_of(Run, name).get_db_prep_save(getattr(run, name), connection)
        for name in RUN_FIELDS
    ]
    params += [run.pk, *sql.insert_params(record)]
    written, *entries = sql.pipelined(
        (_write_statement(), params),
        *([entry.statement()] if entry else []),
        commit=commit and not (entry and entry.listened),
    )
    sql.saved_as(record, written[0][0])
    if entry is not None:
        entry.written(entries[0][0][0])
