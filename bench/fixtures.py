"""Bulk fixtures with PostgreSQL COPY: realistic rows, written fast, never through the services.

`copy_rows(Model, rows)` fills every concrete column a row does not name from the field's
default (or NULL), so a column added by a later migration does not break the bench.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, models


def copy_rows(
    model: type[models.Model], rows: Iterable[dict[str, Any]], *, chunk: int = 20_000
) -> int:
    """COPY `rows` (dicts keyed by field attname) into the model's table; returns the count."""
    from psycopg import sql
    from psycopg.types.json import Jsonb

    fields = [
        field
        for field in model._meta.concrete_fields
        if not (field.primary_key and isinstance(field, models.AutoField | models.BigAutoField))
    ]
    columns = [field.column for field in fields]
    defaults: dict[str, Any] = {}
    for field in fields:
        if field.has_default():
            defaults[field.attname] = field.get_default
        elif getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            defaults[field.attname] = None  # filled from `now` below
    json_fields = {field.attname for field in fields if isinstance(field, models.JSONField)}
    now = datetime.now().astimezone()
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(model._meta.db_table),
        sql.SQL(", ").join(sql.Identifier(column) for column in columns),
    )
    count = 0
    connection.ensure_connection()
    raw = connection.connection
    with raw.cursor() as cursor:
        with cursor.copy(statement) as copy:
            for row in rows:
                values = []
                for field in fields:
                    name = field.attname
                    if name in row:
                        value = row[name]
                    elif name in defaults and defaults[name] is not None:
                        value = defaults[name]()
                    elif getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
                        value = now
                    elif field.null:
                        value = None
                    elif isinstance(field, models.CharField | models.TextField):
                        value = ""
                    else:
                        raise ValueError(f"{model.__name__}.{name} needs a value")
                    if name in json_fields and value is not None:
                        value = Jsonb(value)
                    values.append(value)
                copy.write_row(values)
                count += 1
    return count


def analyze(*tables: str, vacuum: bool = False) -> None:
    """What autovacuum does to a live table: statistics (and, with `vacuum`, the visibility map
    that index-only scans need). Freshly COPYed tables have neither."""
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f'{"VACUUM " if vacuum else ""}ANALYZE "{table}"')


# --------------------------------------------------------------------------------------------
# what real traffic looks like

AGENTS = [
    f"{kind}-agent"
    for kind in (
        "support",
        "billing",
        "deploy",
        "research",
        "triage",
        "refund",
        "sales",
        "onboarding",
        "security",
        "report",
        "migration",
        "qa",
        "docs",
        "compliance",
        "ops",
        "pricing",
        "crm",
        "etl",
        "backup",
        "alerting",
    )
]
TITLES = [
    "Refund ticket",
    "Nightly billing sync",
    "Deploy release",
    "Summarise incident",
    "Rotate credentials",
    "Draft contract",
    "Reconcile invoices",
    "Triage inbox",
    "Migrate tenant",
    "Answer customer",
]
# Most runs are long finished; a few are live, stopping or need a human.
STATUS_WEIGHTS: Sequence[tuple[str, float]] = (
    ("completed", 62),
    ("failed", 8),
    ("cancelled", 5),
    ("stopped_cleanly", 6),
    ("stopped_dirty", 1.2),
    ("handed_off", 2),
    ("interrupted", 2),
    ("suspended", 2),
    ("running", 7),
    ("pending", 3),
    ("cancel_requested", 0.4),
    ("draining", 0.4),
)
STOPPED = {
    "stopped_cleanly",
    "stopped_dirty",
    "handed_off",
    "cancelled",
    "cancel_requested",
    "draining",
}


def stop_request_rows(runs: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """The StopRequest every stopped fixture run has in real life (one per stop epoch). Without
    them, the drain watchdog found ~800 "stopping" runs with no stop request and failed on each,
    every tick, all through the bench (25,500 tracebacks in the Celery log)."""
    for run in runs:
        yield {
            "run_id": run["id"],
            "requested_by": run["stop_requested_by"],
            "actor_kind": "user",
            "reason": run["stop_reason"],
            "requested_at": run["stop_requested_at"],
            "epoch_before": 1,
            "epoch_after": 2,
            "stopped_at": run["stopped_at"],
            "outcome_state": run["status"] if run["stopped_at"] else "",
        }


def run_rows(
    count: int,
    *,
    team_ids: Sequence[int],
    seed: int = 7,
    span_days: int = 120,
    id_prefix: str = "run_b",
    stopping_limit: int = 800,
) -> Iterable[dict[str, Any]]:
    """`count` runs over the last `span_days`, ids like real ones (`run_` + 12 hex).

    At most `stopping_limit` runs are still stopping (`cancel_requested`, `draining`); past
    it, a stopping run is drawn as what the drain watchdog makes of it, `stopped_dirty`. A
    million runs would otherwise leave 8,000 for the watchdog to fence one by one through the
    services before the bench can start (minutes), a backlog no live console has."""
    rng = random.Random(seed)
    statuses = [status for status, _ in STATUS_WEIGHTS]
    weights = [weight for _, weight in STATUS_WEIGHTS]
    now = datetime.now().astimezone()
    stopping = 0
    for index in range(count):
        created = now - timedelta(seconds=rng.uniform(0, span_days * 86400))
        status = rng.choices(statuses, weights)[0]
        if status in ("cancel_requested", "draining"):
            stopping += 1
            if stopping > stopping_limit:
                status = "stopped_dirty"
        stopped = status in STOPPED
        started = created + timedelta(seconds=rng.uniform(0.5, 30))
        finished = (
            started + timedelta(seconds=rng.uniform(5, 3600))
            if status in ("completed", "failed", "cancelled")
            else None
        )
        yield {
            "id": f"{id_prefix}{index:011x}"[:16],
            "team_id": team_ids[index % len(team_ids)]
            if rng.random() < 0.9
            else rng.choice(team_ids),
            "title": f"{rng.choice(TITLES)} #{rng.randint(100, 99999)}",
            "agent": rng.choice(AGENTS),
            "status": status,
            "stop_epoch": 2 if stopped else 1,
            "change_seq": rng.randint(3, 400),
            "stop_reason": rng.choice(
                ("user_stop", "manual_takeover", "budget_exhausted", "timeout")
            )
            if stopped
            else "",
            "stop_requested_by": "alice" if stopped else "",
            "stop_requested_at": started + timedelta(seconds=60) if stopped else None,
            "stopped_at": started + timedelta(seconds=60.2)
            if stopped and status != "cancel_requested"
            else None,
            "tool_calls_count": rng.randint(0, 60),
            "created_by": "bench",
            "created_at": created,
            "started_at": started if status != "pending" else None,
            "finished_at": finished,
            "updated_at": finished or started,
        }


def ledger_chain_rows(
    run_ids: Iterable[str | None], *, per_run: int, team_slug: str, seed: int = 11
) -> Iterable[dict[str, Any]]:
    """`per_run` valid, hash-chained ledger entries for each run (None: the global chain),
    shaped like a run's life: a permit and a result per tool call between create and finish.
    A generator: a million entries never sit in memory at once."""
    from runs.ledger import GENESIS_HASH, KEYED_HASH, _canonical, _timestamp, entry_hash
    from runs.ledger_keys import signing_key

    key = signing_key()
    rng = random.Random(seed)
    start = datetime.now().astimezone() - timedelta(days=30)
    for run_id in run_ids:
        prev = GENESIS_HASH
        stamp = start + timedelta(seconds=rng.uniform(0, 29 * 86400))
        for run_seq in range(1, per_run + 1):
            stamp += timedelta(milliseconds=rng.randint(5, 4000))
            action, payload = _ledger_step(run_seq, per_run, rng)
            payload = _canonical(payload)
            digest = entry_hash(
                key=key,
                team_slug=team_slug,
                run_id=run_id,
                run_seq=run_seq,
                at=_timestamp(stamp),
                actor_kind="api_client",
                actor_id="1",
                actor="bench-agent",
                action=action,
                reason="",
                payload=payload,
                prev_hash=prev,
            )
            yield {
                "run_id": run_id,
                "run_seq": run_seq,
                "at": stamp,
                "actor_kind": "api_client",
                "actor_id": "1",
                "actor": "bench-agent",
                "team_slug": team_slug,
                "action": action,
                "reason": "",
                "payload": payload,
                "prev_hash": prev,
                "hash": digest,
                "hash_version": KEYED_HASH,
                "key_id": key.id,
            }
            prev = digest


def _ledger_step(run_seq: int, per_run: int, rng: random.Random) -> tuple[str, dict[str, Any]]:
    if run_seq == 1:
        return "run.created", {"title": rng.choice(TITLES), "agent": rng.choice(AGENTS)}
    if run_seq == per_run:
        return "run.completed", {"result": {"ok": True}}
    call = f"call_{run_seq // 2:05d}"
    if run_seq % 2:
        return "tool.result", {"tool_call_id": call, "reported": "succeeded"}
    return "tool.permitted", {"tool_call_id": call, "tool": "read_object", "epoch": 1}
