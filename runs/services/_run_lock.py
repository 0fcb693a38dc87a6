"""The run lock: the first statement of every transition, and the run built from its row.

Apart from `_base` so that every transition's opening (`_base.locked_run`, the stop's, the
drained answer's, the events batch's, the permit's and the result's) can send it, whichever of
them `_base` itself imports.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from runs import hooks, sql
from runs.errors import NotFound
from runs.models import Run, Team


def lock_run_row(run_id: str) -> Run:
    """The first query of every transition: the run row, locked, so transitions serialise."""
    if sql.prepared_statements():
        return _lock_run_prepared(run_id)
    try:
        return (
            Run.objects.select_for_update(no_key=True, of=("self",))
            .select_related("team")
            .get(pk=run_id)
        )
    except Run.DoesNotExist:
        raise NotFound(f"run {run_id} does not exist") from None


@functools.cache
def run_lock_statement() -> str:
    """The ORM's lock query above (the run and its team, the run row locked), built once: it is
    the first statement of every transition, and compiling it again each time was a fifth of the
    CPU of an MCP gateway's tool call (a permit and a result: two locks)."""
    return (
        f"SELECT {sql.select_columns(Run)}, {sql.select_columns(Team)} "
        f"FROM {sql.table(Run)} JOIN {sql.table(Team)} "
        f"ON {sql.table(Team)}.{sql.column(Team, 'id')} = {sql.table(Run)}.{sql.column(Run, 'team')} "
        f"WHERE {sql.table(Run)}.{sql.column(Run, 'id')} = %s "
        f"FOR NO KEY UPDATE OF {sql.table(Run)}"
    )


def _lock_run_prepared(run_id: str) -> Run:
    with sql.cursor() as cursor:
        cursor.execute(run_lock_statement(), [run_id])
        return run_from_lock_row(run_id, cursor.fetchone())


def run_from_lock_row(run_id: str, row: Any) -> Run:
    """The run (with its team) from a row of `run_lock_statement`; no row: it does not exist."""
    if row is None:
        raise NotFound(f"run {run_id} does not exist")
    width = len(Run._meta.concrete_fields)
    run: Run = sql.from_row(Run, row[:width])
    run.team = sql.from_row(Team, row[width:])
    return run


def lock_with_read(
    run_id: str, read: tuple[str, list[Any]]
) -> tuple[Run, Sequence[Any], Sequence[Any] | None]:
    """The run lock, then `read` (a statement answering one row) and the row the team's
    policies check against (`hooks.PolicyChecks.read`; None when they read for themselves):
    one pipeline, BEGIN included. The lock held, each read is a fresh snapshot (READ
    COMMITTED). PostgreSQL only (`sql.prepared_statements()`)."""
    checks = hooks.policies().read(run_id)
    locked, (row, *_), *checked = sql.pipelined(
        (run_lock_statement(), [run_id]), read, *([checks] if checks else [])
    )
    run = run_from_lock_row(run_id, locked[0] if locked else None)
    return run, row, checked[0][0] if checked else None
