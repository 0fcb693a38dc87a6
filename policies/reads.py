"""What a policy check reads and writes of the database, in as few statements as it can.

A check used to run one ORM query for the team's policies, one for the run's facts row, one
to load the run columns the events batch leaves deferred, and an ORM save of the facts: at a
permit or a batch with 50 policies that was most of its time (docs/BENCHMARKS.md). Here:

- `read_for_checks`: one statement, after the run lock, in the run's transaction: the version
  of the team's policy set (`PolicySetVersion`; the compiled set itself is cached per process,
  `policies.engine.team_policies`), the facts row and the run columns a policy may read;
- `save_facts`: one upsert of the facts row;
- `policies_changed`: the new version a change of the team's policies writes.

Built once per process from the models' `_meta` (`runs.sql`), PostgreSQL only; on SQLite (the
embedded database of `make run`) the same reads and writes go through the ORM.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import connection

from policies.models import PolicySetVersion, RunFacts
from runs import sql
from runs.models import Run

# The run columns a policy reads (`policies.evaluate.LiveRun`); an events batch builds its run
# without some of them.
RUN_COLUMNS = (
    "agent",
    "started_at",
    "created_at",
    "tool_calls_count",
    "cost_usd",
    "input_tokens",
    "output_tokens",
)


@dataclass
class CheckReads:
    version: int
    facts: RunFacts
    # The run's `RUN_COLUMNS` as committed (empty on SQLite: the run loads its own).
    run_values: dict[str, Any] = field(default_factory=dict)


@functools.cache
def _read_statement() -> str:
    run, facts, versions = sql.table(Run), sql.table(RunFacts), sql.table(PolicySetVersion)
    version = (
        f"(SELECT {versions}.{sql.column(PolicySetVersion, 'version')} FROM {versions} "
        f"WHERE {versions}.{sql.column(PolicySetVersion, 'team_id')} = "
        f"{run}.{sql.column(Run, 'team')})"
    )
    run_columns = ", ".join(f"{run}.{sql.column(Run, name)}" for name in RUN_COLUMNS)
    return (
        f"SELECT {version}, {run_columns}, {sql.select_columns(RunFacts)} FROM {run} "
        f"LEFT JOIN {facts} ON {facts}.{sql.column(RunFacts, 'run')} = {run}.{sql.column(Run, 'id')} "
        f"WHERE {run}.{sql.column(Run, 'id')} = %s"
    )


@functools.cache
def _run_converters() -> list[tuple[str, Any, list[sql.Converter]]]:
    converters = []
    for name in RUN_COLUMNS:
        col = sql.field_of(Run, name).get_col(Run._meta.db_table)
        converters.append(
            (
                name,
                col,
                [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)],
            )
        )
    return converters


def read_for_checks(run: Run) -> CheckReads:
    """The team's policy-set version, the run's facts and its policy columns. Call it under the
    run lock, in the transaction of the fact being checked: a policy change committed before
    it is seen by this check."""
    if not sql.prepared_statements():
        return _read_with_the_orm(run)
    statement, params = read_for_checks_statement(run.pk)
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    return check_reads_of(run, row)


@functools.cache
def _version_statement() -> str:
    run, versions = sql.table(Run), sql.table(PolicySetVersion)
    team = f"SELECT {run}.{sql.column(Run, 'team')} FROM {run} WHERE {run}.{sql.column(Run, 'id')} = %s"
    return (
        f"SELECT (SELECT {versions}.{sql.column(PolicySetVersion, 'version')} FROM {versions} "
        f"WHERE {versions}.{sql.column(PolicySetVersion, 'team_id')} = ({team}))"
    )


def policy_version_statement(run_id: str) -> tuple[str, list[Any]]:
    """One row: the version of the run's team's policy set, NULL for a team that never had a
    policy (`runs.hooks.PolicyChecks.version_read`)."""
    return _version_statement(), [run_id]


def read_for_checks_statement(run_id: str) -> tuple[str, list[Any]]:
    """`read_for_checks`' statement (PostgreSQL), for a caller that sends it in a pipeline of
    its own and hands the row to `check_reads_of` (`runs.hooks.PolicyChecks.read`)."""
    return _read_statement(), [run_id]


def check_reads_of(run: Run, row: Sequence[Any]) -> CheckReads:
    """What `read_for_checks` answers, from the row of `read_for_checks_statement`."""
    width = len(RUN_COLUMNS)
    run_values = {}
    for value, (name, col, converters) in zip(row[1 : width + 1], _run_converters(), strict=True):
        for convert in converters:
            value = convert(value, col, connection)
        run_values[name] = value
    facts_values = row[width + 1 :]
    facts = (
        sql.from_row(RunFacts, facts_values)
        if facts_values[0] is not None
        else RunFacts(run_id=run.pk)
    )
    return CheckReads(version=row[0] or 0, facts=facts, run_values=run_values)


def _read_with_the_orm(run: Run) -> CheckReads:
    version = (
        PolicySetVersion.objects.filter(team_id=run.team_id)
        .values_list("version", flat=True)
        .first()
    )
    facts = RunFacts.objects.filter(run_id=run.pk).first() or RunFacts(run_id=run.pk)
    return CheckReads(version=version or 0, facts=facts)


def policy_set_version(team_id: int) -> int:
    """The version alone, for a check that holds no run (the periodic tick)."""
    found = (
        PolicySetVersion.objects.filter(team_id=team_id).values_list("version", flat=True).first()
    )
    return found or 0


@functools.cache
def _upsert_statement(model: type[RunFacts]) -> str:
    fields = model._meta.concrete_fields
    columns = [sql.quoted(f) for f in fields]
    key = sql.quoted(model._meta.pk)
    return (
        f"INSERT INTO {sql.table(model)} ({', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(columns))}) ON CONFLICT ({key}) DO UPDATE SET "
        + ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c != key)
    )


def save_facts(facts: RunFacts) -> None:
    """Write the run's facts row, new or not, in one statement (the caller holds the run lock)."""
    if not sql.prepared_statements():
        facts.save(force_insert=facts._state.adding)
        facts._state.adding = False
        return
    params = [
        f.get_db_prep_save(getattr(facts, f.attname), connection)
        for f in RunFacts._meta.concrete_fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(_upsert_statement(RunFacts), params)
    facts._state.adding = False


def policies_changed(team_id: int) -> None:
    """A new version of the team's policy set: call it in the transaction of every change to
    the team's policies, so each process's cached compile is dropped at its next check."""
    versions = sql.table(PolicySetVersion)
    team, version = sql.column(PolicySetVersion, "team_id"), sql.column(PolicySetVersion, "version")
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {versions} ({team}, {version}) VALUES (%s, %s) "
            f"ON CONFLICT ({team}) DO UPDATE SET {version} = EXCLUDED.{version}",
            [team_id, secrets.randbits(62) + 1],
        )
