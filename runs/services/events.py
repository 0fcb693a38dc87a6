"""The worker's event batches: steps, artifacts, checkpoints, applied steering, and the run's
own suspend / complete / fail. One transaction and one run lock per batch; every event answered.

On PostgreSQL a batch costs three round trips whatever its size (docs/BENCHMARKS.md): the run
lock, the batch's receipts and its steps go in one pipeline; the rows it
writes (steps, receipts, artifacts, checkpoints, the run's change sequence) in a second, as
hand-written multi-row statements; then the commit. Other databases (the embedded SQLite) take
the ORM path with the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from runs import notify
from runs.actors import Actor
from runs.errors import NotFound
from runs.ledger import ledger_append
from runs.models import (
    STOPPED_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    ApiToken,
    Artifact,
    Checkpoint,
    EventReceipt,
    LeaseReleaseReason,
    RejectedWrite,
    Run,
    RunStatus,
    SteeringMessage,
    SteeringStatus,
    Step,
    StepKind,
    StepStatus,
    StopReason,
    Usage,
)
from runs.pricing import price_call
from runs.services._base import (
    _live_lease,
    _lock_run,
    _move,
    _release_lease,
)
from runs.services.budget import budget_note, exhausted_spend_budget
from runs.services.lifecycle import _stop_locked


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
    "usage",
)


_FORWARD_EVENTS = {
    "step.started",
    "steering.applied",
    "run.suspended",
    "run.completed",
    "run.failed",
}

# Events whose handlers read or write beyond the batch's own rows (the lease, the ledger,
# steering, the run's status): the batch's pending rows are written before they run.
_WIDE_EVENTS = {"steering.applied", "run.suspended", "run.completed", "run.failed"}


def events_ingest(
    *,
    run_id: str,
    epoch: int,
    events: list[dict[str, Any]],
    actor: Actor,
    token_check: TokenCheck | None = None,
) -> list[EventAnswer]:
    """Apply a batch in one transaction under one run lock; answer every event.

    `token_check`: re-check the caller's token in the locking query; `TokenNoLongerValid`
    (nothing written) when it no longer holds.
    """
    ids = [str(event.get("event_id", "")) for event in events]
    keys = _step_keys(events)
    with transaction.atomic(durable=True):
        run, seen, found = _open_batch(run_id, ids, keys, token_check)
        now = timezone.now()
        batch = _Batch(run, keys, found, now)
        answers: list[EventAnswer] = []
        stale = 0
        for event_id, event in zip(ids, events, strict=True):
            event_type = str(event.get("type", ""))
            if event_id in seen:
                answers.append(EventAnswer(event_id, "duplicate"))
                continue
            try:
                _apply_event(run, event_type, event, epoch=epoch, actor=actor, now=now, batch=batch)
                answer = EventAnswer(event_id, "accepted")
            except _EventRejected as rejected:
                answer = EventAnswer(event_id, "rejected", rejected.code, rejected.detail)
                stale += rejected.code == "stale_epoch"
            seen[event_id] = answer.status
            answers.append(answer)
            batch.receipt(event_id, event_type[:40], epoch, answer)
        if stale:
            RejectedWrite.objects.bulk_create(
                RejectedWrite(
                    run=run, kind="event", epoch=epoch, run_epoch=run.stop_epoch, code="stale_epoch"
                )
                for _ in range(stale)
            )
            run.late_writes_rejected += stale
            batch.run_fields.add("late_writes_rejected")
        touch = (
            any(answer.status == "accepted" for answer in answers)
            and run.status not in TERMINAL_STATUSES
        )
        # Usage that reaches a cost or token budget stops the run in this same transaction,
        # under the lock that counted it: no permit can slip in between.
        budget = (
            exhausted_spend_budget(run) if batch.spent and run.status == RunStatus.RUNNING else ""
        )
        batch.flush(touch=touch)
        if touch:
            notify.run_changed(run, kind="events")
        if budget:
            _stop_locked(
                run,
                reason=StopReason.BUDGET_EXHAUSTED,
                note=budget_note(run, budget),
                actor=Actor.system("budget"),
                now=now,
            )
    return answers


def _step_keys(events: Iterable[dict[str, Any]]) -> set[str]:
    return {
        str(value)[:120]
        for event in events
        for name in ("key", "step_key")
        if isinstance(value := event.get(name), str | int | float) and str(value)
    }


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
_LOCK_SQL = (
    "SELECT id, team_id, status, stop_epoch, change_seq, max_cost_usd, max_tokens, cost_usd, "
    'input_tokens, output_tokens, unpriced_tokens FROM "runs_run" WHERE id = %s'
)
# The token is re-read in the statement that takes the lock: no round trip of its own.
_TOKEN_SQL = (
    ' AND EXISTS (SELECT 1 FROM "runs_apitoken" t WHERE t.id = %s AND t.team_id = "runs_run".team_id'
    " AND t.role = %s AND t.revoked_at IS NULL)"
)
_RECEIPTS_SQL = (
    'SELECT event_id, outcome FROM "runs_eventreceipt" WHERE run_id = %s AND event_id = ANY(%s)'
)
# The named steps *and* the run's last one (its seq numbers the new ones), in one statement.
_STEPS_SQL = (
    "SELECT id, run_id, seq, key, name, kind, status, epoch, reported_after_stop, started_at, "
    'finished_at FROM "runs_step" WHERE run_id = %s AND (key = ANY(%s) OR id = '
    '(SELECT id FROM "runs_step" WHERE run_id = %s ORDER BY seq DESC LIMIT 1))'
)


def _open_batch(
    run_id: str, ids: list[str], keys: set[str], token_check: TokenCheck | None
) -> tuple[Run, dict[str, str], list[Step]]:
    if connection.vendor == "postgresql":
        return _open_pipelined(run_id, ids, keys, token_check)
    return _open_orm(run_id, ids, keys, token_check)


def _open_pipelined(
    run_id: str, ids: list[str], keys: set[str], token_check: TokenCheck | None
) -> tuple[Run, dict[str, str], list[Step]]:
    """One round trip: BEGIN, the run lock, then (the lock held, so a fresh snapshot) the
    receipts and steps. PostgreSQL runs a pipeline's statements in order."""
    lock_sql = _LOCK_SQL
    lock_params: list[Any] = [run_id]
    if token_check is not None:
        lock_sql += _TOKEN_SQL
        lock_params += [token_check.token_id, token_check.role]
    lock_sql += " FOR NO KEY UPDATE"
    key_list = sorted(keys)
    with (
        connection.cursor() as lock,
        connection.cursor() as receipts,
        connection.cursor() as steps,
        connection.wrap_database_errors,
        connection.connection.pipeline(),
    ):
        lock.execute(lock_sql, lock_params)
        if ids:
            receipts.execute(_RECEIPTS_SQL, [run_id, ids])
        if key_list:
            steps.execute(_STEPS_SQL, [run_id, key_list, run_id])
        row = lock.fetchone()
        seen = dict(receipts.fetchall()) if ids else {}
        step_rows = steps.fetchall() if key_list else []
    if row is None:
        _missing(run_id, token_check)
    run = Run.from_db(connection.alias, _RUN_FIELDS, row)
    found = [Step.from_db(connection.alias, _STEP_FIELDS, step) for step in step_rows]
    return run, seen, found


def _open_orm(
    run_id: str, ids: list[str], keys: set[str], token_check: TokenCheck | None
) -> tuple[Run, dict[str, str], list[Step]]:
    run = _lock_run(run_id)
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


class _Batch:
    """What one events batch reads and writes.

    Steps: the ones the batch names, read in one query, changed in memory. Under the run lock
    nobody else writes this run's steps, so the objects here are what the database holds plus
    this batch's changes. New rows (steps, receipts, artifacts, checkpoints) and the run's own
    changed fields are kept until `flush()`, which writes each kind in one statement (a step
    started and completed in the same batch is inserted completed); on PostgreSQL the
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
        self.run_fields: set[str] = set()

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
        step = Step(run=self.run, seq=self._next_seq, key=key, created_at=self.now)
        self._next_seq += 1
        self.by_key[key] = step
        self._new.append(step)
        return step

    def changed(self, step: Step) -> None:
        if step.pk is not None:  # a new step is inserted whole by flush()
            self._changed[step.pk] = step

    def receipt(self, event_id: str, event_type: str, epoch: int, answer: EventAnswer) -> None:
        self.receipts.append(
            (self.run.pk, event_id, event_type, epoch, answer.status, answer.code, self.now)
        )

    def flush(self, *, touch: bool = False) -> None:
        """Write what the batch holds; `touch`: bump the run's change sequence too."""
        if touch:
            self.run.change_seq += 1
            self.run_fields.update(("change_seq", "updated_at"))
            self.run.updated_at = self.now
        if connection.vendor == "postgresql":
            self._flush_pipelined()
        else:
            self._flush_orm()
        self._new, self._changed, self.receipts = [], {}, []
        self.artifacts, self.checkpoints, self.usages, self.run_fields = [], [], [], set()

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

    def _flush_pipelined(self) -> None:
        statements = [
            statement
            for statement in (
                _steps_insert(self._new),
                _steps_update(list(self._changed.values())),
                _receipts_insert(self.receipts),
                _rows_insert(Artifact, _ARTIFACT_COLUMNS, self.artifacts),
                _rows_insert(Checkpoint, _CHECKPOINT_COLUMNS, self.checkpoints),
                _rows_insert(Usage, _USAGE_COLUMNS, self.usages),
                _run_update(self.run, self.run_fields),
            )
            if statement is not None
        ]
        if not statements:
            return
        cursors = [connection.cursor() for _ in statements]
        try:
            with connection.wrap_database_errors, connection.connection.pipeline():
                for cursor, (sql, params) in zip(cursors, statements, strict=True):
                    cursor.execute(sql, params)
                if self._new:
                    # The first statement is the steps' INSERT ... RETURNING id, seq.
                    by_seq = {step.seq: step for step in self._new}
                    for pk, seq in cursors[0].fetchall():
                        by_seq[seq].pk = pk
                        by_seq[seq]._state.adding = False
        finally:
            for cursor in cursors:
                cursor.close()


Statement = tuple[str, list[Any]]


def _json(value: Any) -> Any:
    return connection.ops.adapt_json_value(value, None)


def _unnest(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> Statement:
    """`unnest(%s::type[], ...)` over the rows' columns: one array per column, so the statement
    text (and psycopg's parse of it) is the same whatever the batch's size; a multi-row VALUES
    list cost more to build and parse than the rest of a 100-event batch's SQL."""
    arrays = [list(column) for column in zip(*rows, strict=True)]
    sql = ", ".join(f"%s::{kind}[]" for _name, kind in columns)
    return f"unnest({sql})", arrays


_STEP_COLUMNS = (
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


def _steps_insert(steps: list[Step]) -> Statement | None:
    if not steps:
        return None
    source, params = _unnest(
        _STEP_COLUMNS,
        [
            tuple(
                _json(step.detail) if name == "detail" else getattr(step, name)
                for name, _kind in _STEP_COLUMNS
            )
            for step in steps
        ],
    )
    names = ", ".join(name for name, _kind in _STEP_COLUMNS)
    return f'INSERT INTO "runs_step" ({names}) SELECT * FROM {source} RETURNING id, seq', params


_STEP_UPDATE_COLUMNS = (
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


def _steps_update(steps: list[Step]) -> Statement | None:
    if not steps:
        return None
    source, params = _unnest(
        _STEP_UPDATE_COLUMNS,
        [
            (
                step.pk,
                step.name,
                step.kind,
                step.status,
                step.epoch,
                step.started_at,
                step.finished_at,
                step.reported_after_stop,
                # NULL: not changed by this batch (a step's detail is never null), so a step
                # read without its detail is never written back with one.
                _json(step.__dict__["detail"]) if "detail" in step.__dict__ else None,
            )
            for step in steps
        ],
    )
    names = ", ".join(name for name, _kind in _STEP_UPDATE_COLUMNS)
    return (
        'UPDATE "runs_step" AS s SET name = v.name, kind = v.kind, status = v.status, '
        "epoch = v.epoch, started_at = v.started_at, finished_at = v.finished_at, "
        "reported_after_stop = v.reported_after_stop, detail = COALESCE(v.detail, s.detail) "
        f"FROM {source} AS v({names}) WHERE s.id = v.id",
        params,
    )


_RECEIPT_COLUMNS = (
    ("run_id", "varchar"),
    ("event_id", "varchar"),
    ("type", "varchar"),
    ("epoch", "integer"),
    ("outcome", "varchar"),
    ("code", "varchar"),
    ("received_at", "timestamptz"),
)
_ARTIFACT_COLUMNS = (
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
_CHECKPOINT_COLUMNS = (
    ("run_id", "varchar"),
    ("step_seq", "integer"),
    ("label", "varchar"),
    ("state", "jsonb"),
    ("epoch", "integer"),
    ("created_at", "timestamptz"),
)


_USAGE_COLUMNS = (
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


def _receipts_insert(rows: list[tuple[Any, ...]]) -> Statement | None:
    if not rows:
        return None
    source, params = _unnest(_RECEIPT_COLUMNS, rows)
    names = ", ".join(name for name, _kind in _RECEIPT_COLUMNS)
    return f'INSERT INTO "runs_eventreceipt" ({names}) SELECT * FROM {source}', params


def _rows_insert(
    model: Any, columns: Sequence[tuple[str, str]], rows: list[Any]
) -> Statement | None:
    if not rows:
        return None
    source, params = _unnest(
        columns,
        [
            tuple(
                _json(getattr(row, name)) if kind == "jsonb" else getattr(row, name)
                for name, kind in columns
            )
            for row in rows
        ],
    )
    names = ", ".join(name for name, _kind in columns)
    return f'INSERT INTO "{model._meta.db_table}" ({names}) SELECT * FROM {source}', params


def _run_update(run: Run, fields: set[str]) -> Statement | None:
    if not fields:
        return None
    names = sorted(fields)
    assignments = ", ".join(f"{name} = %s" for name in names)
    return (
        f'UPDATE "runs_run" SET {assignments} WHERE id = %s',
        [getattr(run, name) for name in names] + [run.pk],
    )


def _apply_event(
    run: Run,
    event_type: str,
    event: dict[str, Any],
    *,
    epoch: int,
    actor: Actor,
    now: datetime,
    batch: _Batch,
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
    if event_type in _WIDE_EVENTS:
        batch.flush()
    handler(run, event, epoch=epoch, actor=actor, now=now, batch=batch)


def _keep_late_outcome(
    run: Run, event_type: str, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime
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
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
) -> None:
    key = _text(event, "key", limit=120)
    if not key:
        raise _EventRejected("invalid", "step.started needs a key")
    kind = _text(event, "kind", StepKind.MODEL_CALL)
    if kind not in StepKind.values:
        raise _EventRejected("invalid", f"kind must be one of {', '.join(StepKind.values)}")
    existing = batch.get(key)
    # Validate everything before a new step takes a seq (a rejected event writes nothing).
    name = _text(event, "name", (existing.name if existing else "") or key)
    step = existing or batch.new(key)
    step.name = name
    step.kind = kind
    step.status = StepStatus.RUNNING
    step.epoch = epoch
    step.started_at = now
    step.finished_at = None
    batch.changed(step)


def _step_owned_by_epoch(run: Run, event: dict[str, Any], epoch: int, batch: _Batch) -> Step:
    key = _text(event, "key", limit=120)
    step = batch.get(key)
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
        run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
    ) -> None:
        step = _step_owned_by_epoch(run, event, epoch, batch)
        step.status = status
        step.finished_at = now
        step.reported_after_stop = epoch < run.stop_epoch
        detail = event.get("detail") or event.get("error")
        if detail is not None:
            step.detail = detail if isinstance(detail, dict) else {"detail": str(detail)[:2000]}
        batch.changed(step)

    return handler


def _on_artifact_added(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
) -> None:
    name = _text(event, "name")
    if not name:
        raise _EventRejected("invalid", "artifact.added needs a name")
    step_key = _text(event, "step_key", limit=120)
    step = batch.saved(step_key) if step_key else None
    batch.artifacts.append(
        Artifact(
            run=run,
            step_id=step.pk if step is not None else None,
            name=name,
            kind=_text(event, "kind", limit=60),
            uri=_text(event, "uri", limit=1000),
            content=_text(event, "content", limit=100_000),
            checksum=_text(event, "checksum", limit=128),
            reusable=bool(event.get("reusable", False)),
            evidence=bool(event.get("evidence", False)),
            epoch=epoch,
            created_at=now,
        )
    )


def _on_checkpoint_saved(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
) -> None:
    label = _text(event, "label", limit=120)
    if not label:
        raise _EventRejected("invalid", "checkpoint.saved needs a label")
    state = event.get("state") or {}
    if not isinstance(state, dict):
        raise _EventRejected("invalid", "state must be an object")
    step_seq = event.get("step_seq")
    batch.checkpoints.append(
        Checkpoint(
            run=run,
            label=label,
            state=state,
            epoch=epoch,
            step_seq=step_seq if isinstance(step_seq, int) and step_seq >= 0 else None,
            created_at=now,
        )
    )
    # Only the epoch being stopped (or the running one) may move the resume point; an older
    # round's checkpoint is kept but never redirects a newer round.
    if epoch == run.stop_epoch or (
        epoch == run.stop_epoch - 1 and run.status in (*STOPPING_STATUSES, *STOPPED_STATUSES)
    ):
        run.resume_from = label
        batch.run_fields.add("resume_from")


def _on_steering_applied(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
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
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
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
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
) -> None:
    _finish_locked(run, RunStatus.COMPLETED, actor=actor, now=now, result=event.get("result"))


def _on_run_failed(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
) -> None:
    error = event.get("error")
    _finish_locked(
        run,
        RunStatus.FAILED,
        actor=actor,
        now=now,
        failure=error if isinstance(error, dict) else {"error": str(error)},
    )


# One call's counts: no model reads or writes this many tokens in one call, and no call costs
# this much; a larger figure is a bug in the reporter (a cumulative total, a unit mix-up), and
# counting it would stop runs on budgets they never spent.
MAX_CALL_TOKENS = 100_000_000
MAX_CALL_COST_USD = Decimal(10_000)
_COST_PLACES = Decimal("1e-10")  # Usage.cost_usd's scale: stored sums equal the rows' sums
_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _tokens(event: dict[str, Any], key: str, *, required: bool) -> int:
    value = event.get(key)
    if value is None:
        if required:
            raise _EventRejected("invalid", f"usage needs {key}")
        return 0
    if type(value) is not int:  # not bool, not 12.5, not "12"
        raise _EventRejected("invalid", f"{key} must be a whole number of tokens")
    if value < 0:
        raise _EventRejected("invalid", f"{key} must not be negative")
    if value > MAX_CALL_TOKENS:
        raise _EventRejected(
            "invalid", f"{key} {value} is more than one call can use ({MAX_CALL_TOKENS})"
        )
    return value


def _cost(event: dict[str, Any]) -> Decimal | None:
    value = event.get("cost_usd")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _EventRejected("invalid", "cost_usd must be a number")
    try:
        cost = Decimal(str(value).strip())
    except InvalidOperation:
        raise _EventRejected("invalid", "cost_usd must be a number") from None
    if not cost.is_finite():
        raise _EventRejected("invalid", "cost_usd must be a finite number")
    if cost < 0:
        raise _EventRejected("invalid", "cost_usd must not be negative")
    if cost > MAX_CALL_COST_USD:
        raise _EventRejected(
            "invalid", f"cost_usd {cost} is more than one call can cost ({MAX_CALL_COST_USD})"
        )
    return cost.quantize(_COST_PLACES)


def _name(event: dict[str, Any], key: str, limit: int) -> str:
    value = event.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _EventRejected("invalid", f"{key} must be a string")
    value = value.strip()
    if len(value) > limit:
        # Refused, not cut: a cut name could price as another model.
        raise _EventRejected("invalid", f"{key} is longer than {limit} characters")
    return value


def _on_usage(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: _Batch
) -> None:
    """One model call's tokens, priced now (DESIGN §13). A fact: accepted after a stop too (the
    bill still comes), and then counted as late spend. Everything is checked before anything
    is kept, so a rejected event changes no row and no total."""
    cost = _cost(event)
    model = _name(event, "model", 200)
    if not model:
        raise _EventRejected(
            "invalid", "cost_usd needs a model" if cost is not None else "usage needs a model"
        )
    provider = _name(event, "provider", 100)
    counts = {key: _tokens(event, key, required=key in _TOKEN_FIELDS[:2]) for key in _TOKEN_FIELDS}
    if counts["cache_read_tokens"] + counts["cache_write_tokens"] > counts["input_tokens"]:
        raise _EventRejected(
            "invalid",
            "cache_read_tokens + cache_write_tokens exceed input_tokens "
            "(input_tokens counts every input token, cached or not)",
        )
    step_key = _text(event, "step_key", limit=120)
    price = price_call(
        model=model,
        provider=provider,
        input_tokens=counts["input_tokens"],
        output_tokens=counts["output_tokens"],
        cache_read_tokens=counts["cache_read_tokens"],
        cache_write_tokens=counts["cache_write_tokens"],
        reported_cost_usd=cost,
        at=now,
    )
    priced = None if price.cost_usd is None else price.cost_usd.quantize(_COST_PLACES)
    batch.usages.append(
        Usage(
            run=run,
            event_id=str(event["event_id"]),
            epoch=epoch,
            step_key=step_key,
            model=model,
            provider=provider,
            cost_usd=priced,
            price_source=price.source,
            price_version=price.version,
            at=now,
            **counts,
        )
    )
    run.input_tokens += counts["input_tokens"]
    run.output_tokens += counts["output_tokens"]
    fields = ["input_tokens", "output_tokens"]
    if priced is None:
        run.unpriced_tokens += counts["input_tokens"] + counts["output_tokens"]
        fields.append("unpriced_tokens")
    else:
        run.cost_usd += priced
        fields.append("cost_usd")
    batch.run_fields.update(fields)
    batch.spent = True


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
    "usage": _on_usage,
}


def _finish_locked(
    run: Run, to: str, *, actor: Actor, now: datetime, result: Any = None, failure: Any = None
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
