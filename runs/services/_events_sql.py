"""An events batch's reads in one round trip and its writes in another, as statements built once.

On PostgreSQL a batch costs two round trips whatever its size (docs/BENCHMARKS.md): BEGIN, the
run lock (with the caller's token re-read in the same statement), the batch's receipts and its
steps and the version of the team's policies go in one pipeline (`open_batch`); the rows it
writes (steps, receipts, artifacts, checkpoints, usage, the run's changed fields), one
statement per table over its rows as one JSON parameter (`json_to_recordset`), and the COMMIT
after them, in a second (`EventBatch.flush`). When a policy of the team looks at batches, or
the batch's spend is to be charged, the policies' read goes after the writes instead, and the
COMMIT in a third round trip after what the checks write. Every row is read once a pipeline
has ended: a fetch inside one waits for a round trip of its own. The statements' text is built once per process from the
models' `_meta` (`runs.sql`). Other databases (the embedded SQLite) take the ORM path, one
statement at a time, with the same rules.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models import Exists, OuterRef, Q

from runs import sql
from runs.errors import NotFound
from runs.models import (
    ApiToken,
    Artifact,
    Checkpoint,
    EventReceipt,
    Run,
    Step,
    Usage,
)
from runs.pricing import TeamPrices
from runs.services._base import lock_run_row


@dataclass(frozen=True)
class TokenCheck:
    """The caller's API token as a per-process cache saw it (`api.events_fast`).

    The query that locks the run re-reads the token (not revoked, same team, same role), so a
    revocation takes effect at once in every process without a token lookup of its own.
    """

    token_id: int
    team_id: int
    role: str


class TokenNoLongerValid(Exception):
    """The token of a `TokenCheck` is revoked or changed; the batch wrote nothing."""


# --------------------------------------------------------------------------------------------
# opening a batch: the run lock, the receipts already seen, the named steps and the last one

# `Model.from_db` takes a subset of the columns in the model's field order; the rest are
# deferred (loaded on first access, under the same lock).
# The cost columns are last in the model, so these stay in its field order.
_RUN_FIELDS = (
    "id",
    "team_id",
    "status",
    "stop_epoch",
    "change_seq",
    "max_cost_usd",
    "max_tokens",
    "cost_usd",
    "input_tokens",
    "output_tokens",
    "unpriced_tokens",
)
_STEP_FIELDS = (
    "id",
    "run_id",
    "seq",
    "key",
    "name",
    "kind",
    "status",
    "epoch",
    "reported_after_stop",
    "started_at",
    "finished_at",
)


def _columns(model: type[models.Model], names: Sequence[str]) -> str:
    return ", ".join(sql.column(model, name) for name in names)


@functools.cache
def _lock_statement(with_token: bool) -> str:
    run, run_id, run_team = sql.table(Run), sql.column(Run, "id"), sql.column(Run, "team")
    statement = f"SELECT {_columns(Run, _RUN_FIELDS)} FROM {run} WHERE {run_id} = %s"
    if with_token:
        # The token is re-read in the statement that takes the lock: no round trip of its own.
        statement += (
            f" AND EXISTS (SELECT 1 FROM {sql.table(ApiToken)} t "
            f"WHERE t.{sql.column(ApiToken, 'id')} = %s "
            f"AND t.{sql.column(ApiToken, 'team')} = {run}.{run_team} "
            f"AND t.{sql.column(ApiToken, 'role')} = %s "
            f"AND t.{sql.column(ApiToken, 'revoked_at')} IS NULL)"
        )
    return statement + " FOR NO KEY UPDATE"


@functools.cache
def _receipts_statement() -> str:
    return (
        f"SELECT {_columns(EventReceipt, ('event_id', 'outcome'))} FROM {sql.table(EventReceipt)} "
        f"WHERE {sql.column(EventReceipt, 'run')} = %s "
        f"AND {sql.column(EventReceipt, 'event_id')} = ANY(%s)"
    )


@functools.cache
def _steps_statement() -> str:
    """The named steps *and* the run's last one (its seq numbers the new ones)."""
    step, run_id, seq = sql.table(Step), sql.column(Step, "run"), sql.column(Step, "seq")
    step_id = sql.column(Step, "id")
    return (
        f"SELECT {_columns(Step, _STEP_FIELDS)} FROM {step} "
        f"WHERE {run_id} = %s AND ({sql.column(Step, 'key')} = ANY(%s) OR {step_id} = "
        f"(SELECT {step_id} FROM {step} WHERE {run_id} = %s ORDER BY {seq} DESC LIMIT 1))"
    )


@dataclass(frozen=True)
class BatchOpening:
    run: Run
    # Each event id already received → its outcome.
    seen: dict[str, str]
    # The steps the batch names and the run's last one.
    found: list[Step]
    # The first row of `open_batch`'s `also` statement; None without one.
    also: Sequence[Any] | None = None


def open_batch(
    run_id: str,
    ids: list[str],
    keys: set[str],
    token_check: TokenCheck | None,
    also: Statement | None = None,
) -> BatchOpening:
    """The run, locked; the outcomes of the batch's event ids already received; the steps the
    batch names and the run's last one; the row of `also`, a read sent after them (PostgreSQL
    only). Call it first in the batch's durable transaction."""
    if sql.prepared_statements():
        return _open_pipelined(run_id, ids, keys, token_check, also)
    run, seen, found = _open_orm(run_id, ids, keys, token_check)
    return BatchOpening(run, seen, found)


def _open_pipelined(
    run_id: str,
    ids: list[str],
    keys: set[str],
    token_check: TokenCheck | None,
    also: Statement | None,
) -> BatchOpening:
    """One round trip: BEGIN, the run lock, then (the lock held, so a fresh snapshot) the
    receipts, the steps and `also`. PostgreSQL runs a pipeline's statements in order."""
    lock_params: list[Any] = [run_id]
    if token_check is not None:
        lock_params += [token_check.token_id, token_check.role]
    key_list = sorted(keys)
    with (
        connection.cursor() as lock,
        connection.cursor() as receipts,
        connection.cursor() as steps,
        connection.cursor() as read,
        connection.wrap_database_errors,
    ):
        with sql.pipeline(connection):
            lock.execute(_lock_statement(token_check is not None), lock_params)
            if ids:
                receipts.execute(_receipts_statement(), [run_id, ids])
            if key_list:
                steps.execute(_steps_statement(), [run_id, key_list, run_id])
            if also is not None:
                read.execute(*also)
        # Read once the pipeline has ended (`sql.pipeline`).
        row = lock.fetchone()
        seen = dict(receipts.fetchall()) if ids else {}
        step_rows = steps.fetchall() if key_list else []
        also_row = read.fetchone() if also is not None else None
    if row is None:
        _missing(run_id, token_check)
    run = Run.from_db(connection.alias, _RUN_FIELDS, row)
    found = [Step.from_db(connection.alias, _STEP_FIELDS, step) for step in step_rows]
    return BatchOpening(run, seen, found, also_row)


def _open_orm(
    run_id: str, ids: list[str], keys: set[str], token_check: TokenCheck | None
) -> tuple[Run, dict[str, str], list[Step]]:
    run = lock_run_row(run_id)
    if token_check is not None and not _token_holds(run, token_check):
        raise TokenNoLongerValid(f"token {token_check.token_id}")
    seen = dict(
        EventReceipt.objects.filter(run=run, event_id__in=ids).values_list("event_id", "outcome")
    )
    last_step = Step.objects.filter(run=run).order_by("-seq").values("pk")[:1]
    found = (
        list(Step.objects.filter(Q(key__in=keys) | Q(pk__in=last_step), run=run)) if keys else []
    )
    return run, seen, found


def _token_holds(run: Run, check: TokenCheck) -> bool:
    return (
        Run.objects.filter(
            pk=run.pk,
            team_id=check.team_id,
        )
        .filter(
            Exists(
                ApiToken.objects.filter(
                    pk=check.token_id,
                    team_id=OuterRef("team_id"),
                    role=check.role,
                    revoked_at__isnull=True,
                )
            )
        )
        .exists()
    )


def _missing(run_id: str, token_check: TokenCheck | None) -> None:
    if token_check is not None and Run.objects.filter(pk=run_id).exists():
        raise TokenNoLongerValid(f"token {token_check.token_id}")
    raise NotFound(f"run {run_id} does not exist")


# --------------------------------------------------------------------------------------------
# the batch's rows: read once, changed in memory, written once


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


class EventBatch:
    """What one events batch reads and writes.

    Steps: the ones the batch names, read in one query, changed in memory. Under the run lock
    nobody else writes this run's steps, so the objects here are what the database holds plus
    this batch's changes. New rows (steps, receipts, artifacts, checkpoints, usage) and the
    run's own changed fields are kept until `flush()`, which writes each kind in one statement
    (a step started and completed in the same batch is inserted completed); on PostgreSQL the
    statements go in one pipeline. Before, every event cost a lookup and a write of its own
    (docs/BENCHMARKS.md, ingestion).
    """

    def __init__(self, run: Run, keys: set[str], found: list[Step], now: datetime) -> None:
        self.run = run
        self.now = now
        self.by_key = {step.key: step for step in found if step.key in keys}
        self._next_seq: int | None = (
            max((step.seq for step in found), default=0) + 1 if keys else None
        )
        self._new: list[Step] = []
        self._changed: dict[int, Step] = {}
        # Receipts are plain tuples in `_RECEIPT_COLUMNS` order: a model instance per event
        # cost more than its share of the INSERT (the batch profile).
        self.receipts: list[tuple[Any, ...]] = []
        self.artifacts: list[Artifact] = []
        self.checkpoints: list[Checkpoint] = []
        self.usages: list[Usage] = []
        self.spent = False  # a usage event was accepted: the cost budgets need a look
        self.cost_usd = Decimal(0)  # what the accepted usage cost (priced rows only)
        self._team_prices: TeamPrices | None = None
        self.run_fields: set[str] = set()

    def get(self, key: str) -> Step | None:
        return self.by_key.get(key)

    def team_prices(self) -> TeamPrices:
        """The team's own prices, read once, on the batch's first usage event."""
        if self._team_prices is None:
            self._team_prices = TeamPrices.for_team(self.run.team_id)
        return self._team_prices

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
        step = Step(run=self.run, seq=self._next_seq, key=key, created_at=self.now)
        self._next_seq += 1
        self.by_key[key] = step
        self._new.append(step)
        return step

    def changed(self, step: Step) -> None:
        if step.pk is not None:  # a new step is inserted whole by flush()
            self._changed[step.pk] = step

    def receipt(self, event_id: str, event_type: str, epoch: int, outcome: str, code: str) -> None:
        self.receipts.append((self.run.pk, event_id, event_type, epoch, outcome, code, self.now))

    def flush(
        self, *, touch: bool = False, read: Statement | None = None, commit: bool = False
    ) -> Sequence[Any] | None:
        """Write what the batch holds; `touch`: bump the run's change sequence too. `read`: a
        statement sent after the writes (so it sees them) in the same round trip; its first
        row is returned (None without one). `commit`: these are the transaction's last
        statements, its COMMIT may go with them (`sql.pipelined`)."""
        if touch:
            self.run.change_seq += 1
            self.run_fields.update(("change_seq", "updated_at"))
            self.run.updated_at = self.now
        if sql.prepared_statements():
            row = self._flush_pipelined(read, commit=commit)
        else:
            self._flush_orm()
            row = _read_one(read) if read is not None else None
        self._new, self._changed, self.receipts = [], {}, []
        self.artifacts, self.checkpoints, self.usages, self.run_fields = [], [], [], set()
        return row

    def _flush_orm(self) -> None:
        if self._new:
            Step.objects.bulk_create(self._new)
        if self._changed:
            Step.objects.bulk_update(list(self._changed.values()), _STEP_EVENT_FIELDS)
        if self.receipts:
            EventReceipt.objects.bulk_create(
                EventReceipt(**dict(zip((name for name, _ in _RECEIPT_COLUMNS), row, strict=True)))
                for row in self.receipts
            )
        if self.artifacts:
            Artifact.objects.bulk_create(self.artifacts)
        if self.checkpoints:
            Checkpoint.objects.bulk_create(self.checkpoints)
        if self.usages:
            Usage.objects.bulk_create(self.usages)
        if self.run_fields:
            self.run.save(update_fields=sorted(self.run_fields))

    def _flush_pipelined(self, read: Statement | None, *, commit: bool) -> Sequence[Any] | None:
        statements = [
            statement
            for statement in (
                _steps_insert(self._new),
                _steps_update(list(self._changed.values())),
                _rows_insert(EventReceipt, _RECEIPT_COLUMNS, self.receipts, as_tuples=True),
                _rows_insert(Artifact, _ARTIFACT_COLUMNS, self.artifacts),
                _rows_insert(Checkpoint, _CHECKPOINT_COLUMNS, self.checkpoints),
                _rows_insert(Usage, _USAGE_COLUMNS, self.usages),
                _run_update(self.run, self.run_fields),
            )
            if statement is not None
        ]
        if read is not None:
            statements.append(read)
        if not statements:
            return None
        db = connections[DEFAULT_DB_ALIAS]
        cursors = [db.cursor() for _ in statements]
        try:
            with db.wrap_database_errors:
                with sql.pipeline(db, commit=commit):
                    for cursor, (statement, params) in zip(cursors, statements, strict=True):
                        cursor.execute(statement, params)
                # Read once the pipeline has ended (one round trip, not a flush's and a sync's).
                if self._new:
                    # The first statement is the steps' INSERT ... RETURNING id, seq.
                    by_seq = {step.seq: step for step in self._new}
                    for pk, seq in cursors[0].fetchall():
                        by_seq[seq].pk = pk
                        by_seq[seq]._state.adding = False
                row: Sequence[Any] | None = cursors[-1].fetchone() if read is not None else None
        finally:
            for cursor in cursors:
                cursor.close()
        return row


def _read_one(read: Statement) -> Sequence[Any] | None:
    statement, params = read
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row: Sequence[Any] | None = cursor.fetchone()
    return row


Statement = tuple[str, list[Any]]
# (attribute name, PostgreSQL type) per column a `_recordset` statement writes.
Columns = tuple[tuple[str, str], ...]


@functools.cache
def _recordset(columns: Columns) -> str:
    """`json_to_recordset(%s::json) AS v(name type, ...)`: the rows as one JSON parameter, typed
    by PostgreSQL. The statement text is the same whatever the batch's size (a multi-row VALUES
    list cost more to build and parse than the rest of a 100-event batch's SQL), and the rows
    cost one `json.dumps` in C: one Python list per column, as `unnest` arrays, made psycopg
    walk every list to pick its array type and dump each element on its own, most of the CPU
    time of a single event's statements (docs/BENCHMARKS.md)."""
    quote = connection.ops.quote_name
    definitions = ", ".join(f"{quote(name)} {kind}" for name, kind in columns)
    return f"json_to_recordset(%s::json) AS v({definitions})"


def _json_scalar(value: Any) -> Any:
    """A column's value that `json` has no form of, as the text PostgreSQL reads it from."""
    if isinstance(value, datetime):
        return value.isoformat()  # with its offset: a timestamptz, to the microsecond
    if isinstance(value, Decimal):
        return str(value)  # numeric, exact
    raise TypeError(f"{type(value).__name__} is not a column value")


def _json_rows(columns: Columns, rows: Sequence[Sequence[Any]]) -> str:
    """`rows` (tuples in `columns`' order) as `_recordset`'s parameter. A `jsonb` column's value
    goes in as it is; JSON null is SQL NULL in every column."""
    names = [name for name, _kind in columns]
    return json.dumps(
        [dict(zip(names, row, strict=True)) for row in rows],
        default=_json_scalar,
        ensure_ascii=False,
        separators=(",", ":"),
    )


@functools.cache
def _insert_statement(model: type[models.Model], columns: Columns, returning: str = "") -> str:
    return (
        f"INSERT INTO {sql.table(model)} ({_columns(model, [name for name, _ in columns])}) "
        f"SELECT * FROM {_recordset(columns)}{returning}"
    )


_STEP_COLUMNS: Columns = (
    ("run_id", "varchar"),
    ("seq", "integer"),
    ("key", "varchar"),
    ("name", "varchar"),
    ("kind", "varchar"),
    ("status", "varchar"),
    ("epoch", "integer"),
    ("detail", "jsonb"),
    ("reported_after_stop", "boolean"),
    ("created_at", "timestamptz"),
    ("started_at", "timestamptz"),
    ("finished_at", "timestamptz"),
)


@functools.cache
def _steps_insert_statement() -> str:
    returning = f" RETURNING {_columns(Step, ('id', 'seq'))}"
    return _insert_statement(Step, _STEP_COLUMNS, returning)


def _steps_insert(steps: list[Step]) -> Statement | None:
    if not steps:
        return None
    rows = [tuple(getattr(step, name) for name, _kind in _STEP_COLUMNS) for step in steps]
    return _steps_insert_statement(), [_json_rows(_STEP_COLUMNS, rows)]


_STEP_UPDATE_COLUMNS: Columns = (
    ("id", "bigint"),
    ("name", "varchar"),
    ("kind", "varchar"),
    ("status", "varchar"),
    ("epoch", "integer"),
    ("started_at", "timestamptz"),
    ("finished_at", "timestamptz"),
    ("reported_after_stop", "boolean"),
    ("detail", "jsonb"),
)


@functools.cache
def _steps_update_statement() -> str:
    quote = connection.ops.quote_name
    names = [name for name, _kind in _STEP_UPDATE_COLUMNS]
    assignments = ", ".join(
        # NULL detail: not changed by this batch (a step's detail is never null).
        f"{sql.column(Step, name)} = COALESCE(v.{quote(name)}, s.{sql.column(Step, name)})"
        if name == "detail"
        else f"{sql.column(Step, name)} = v.{quote(name)}"
        for name in names[1:]
    )
    return (
        f"UPDATE {sql.table(Step)} AS s SET {assignments} "
        f"FROM {_recordset(_STEP_UPDATE_COLUMNS)} "
        f"WHERE s.{sql.column(Step, 'id')} = v.{quote('id')}"
    )


def _steps_update(steps: list[Step]) -> Statement | None:
    if not steps:
        return None
    rows = [
        (
            step.pk,
            step.name,
            step.kind,
            step.status,
            step.epoch,
            step.started_at,
            step.finished_at,
            step.reported_after_stop,
            # NULL: not changed by this batch, so a step read without its detail is never
            # written back with one.
            step.__dict__.get("detail"),
        )
        for step in steps
    ]
    return _steps_update_statement(), [_json_rows(_STEP_UPDATE_COLUMNS, rows)]


_RECEIPT_COLUMNS: Columns = (
    ("run_id", "varchar"),
    ("event_id", "varchar"),
    ("type", "varchar"),
    ("epoch", "integer"),
    ("outcome", "varchar"),
    ("code", "varchar"),
    ("received_at", "timestamptz"),
)
_ARTIFACT_COLUMNS: Columns = (
    ("run_id", "varchar"),
    ("step_id", "bigint"),
    ("name", "varchar"),
    ("kind", "varchar"),
    ("uri", "varchar"),
    ("content", "text"),
    ("checksum", "varchar"),
    ("reusable", "boolean"),
    ("evidence", "boolean"),
    ("epoch", "integer"),
    ("created_at", "timestamptz"),
)
_CHECKPOINT_COLUMNS: Columns = (
    ("run_id", "varchar"),
    ("step_seq", "integer"),
    ("label", "varchar"),
    ("state", "jsonb"),
    ("epoch", "integer"),
    ("created_at", "timestamptz"),
)
_USAGE_COLUMNS: Columns = (
    ("run_id", "varchar"),
    ("event_id", "varchar"),
    ("epoch", "integer"),
    ("step_key", "varchar"),
    ("model", "varchar"),
    ("provider", "varchar"),
    ("input_tokens", "bigint"),
    ("output_tokens", "bigint"),
    ("cache_read_tokens", "bigint"),
    ("cache_write_tokens", "bigint"),
    ("cost_usd", "numeric"),
    ("price_source", "varchar"),
    ("price_version", "varchar"),
    ("at", "timestamptz"),
)


def _rows_insert(
    model: type[models.Model], columns: Columns, rows: list[Any], *, as_tuples: bool = False
) -> Statement | None:
    """`rows`: model instances, or (`as_tuples`) tuples already in `columns`' order."""
    if not rows:
        return None
    if not as_tuples:
        rows = [tuple(getattr(row, name) for name, _kind in columns) for row in rows]
    return _insert_statement(model, columns), [_json_rows(columns, rows)]


@functools.cache
def _run_update_statement(names: tuple[str, ...]) -> str:
    assignments = ", ".join(f"{sql.column(Run, name)} = %s" for name in names)
    return f"UPDATE {sql.table(Run)} SET {assignments} WHERE {sql.column(Run, 'id')} = %s"


def _run_update(run: Run, fields: set[str]) -> Statement | None:
    if not fields:
        return None
    names = tuple(sorted(fields))
    return _run_update_statement(names), [getattr(run, name) for name in names] + [run.pk]
