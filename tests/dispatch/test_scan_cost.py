"""The dispatcher's scan reads the queue, not the outbox (it runs every tick, on the
database every stop waits for).

`outbox_claim_next` once asked for "pending items of running runs OR released items" in one
query, and released items had no index of their own, so PostgreSQL could not walk the partial
indexes: each tick visited every outbox row of every running or stopped run (64 ms a tick over 1M frozen items, docs/BENCHMARKS.md). Measured
here in buffers PostgreSQL touched (EXPLAIN ANALYZE), not in time: the same on any machine.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import services
from runs.actors import Actor
from runs.models import OutboxItem, OutboxStatus
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = Actor.system("agent")
RUNS_WITH_HISTORY = 4
ITEMS_PER_RUN = 1_500


def _sent_items(run, count: int) -> list[OutboxItem]:
    now = timezone.now()
    return [
        OutboxItem(
            run=run,
            transport="webhook",
            destination="https://hooks.example/sent",
            payload={"seq": seq, "body": "x" * 200},
            idempotency_key=f"sent-{seq}",
            status=OutboxStatus.SENT,
            enqueue_epoch=run.stop_epoch,
            claim_epoch=run.stop_epoch,
            sent_at=now,
        )
        for seq in range(count)
    ]


def _buffers(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
        (plan,) = cursor.fetchone()
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def test_the_scan_touches_a_few_buffers_however_much_outbox_history_running_runs_have(
    team, settings
):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]
    for _ in range(RUNS_WITH_HISTORY):
        run, _lease = make_running(team, ttl=3600)
        OutboxItem.objects.bulk_create(_sent_items(run, ITEMS_PER_RUN), batch_size=500)
    waiting, _lease = make_running(team, ttl=3600)
    item, _created = services.outbox_enqueue(
        run_id=waiting.pk,
        epoch=waiting.stop_epoch,
        transport="webhook",
        destination="https://hooks.example/next",
        payload={},
        idempotency_key="next",
        actor=AGENT,
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboxItem._meta.db_table}")

    with CaptureQueriesContext(connection) as captured:
        claimed = services.outbox_claim_next(dispatcher="scan-test")

    assert claimed is not None and claimed.pk == item.pk  # it still finds the oldest item
    scan_select = f'SELECT "{OutboxItem._meta.db_table}"."created_at"'
    scans = [q["sql"] for q in captured.captured_queries if q["sql"].startswith(scan_select)]
    assert len(scans) == 2, [q["sql"] for q in captured.captured_queries]
    history = _buffers(
        f"SELECT count(*) FROM {OutboxItem._meta.db_table} "
        f"WHERE run_id IN (SELECT run_id FROM {OutboxItem._meta.db_table} WHERE status = 'sent')"
    )
    assert history > 200, history  # the history is big enough for a full visit to show
    for sql in scans:
        assert _buffers(sql) < 40, sql


def _indexes_used(plan: dict) -> set[str]:
    used = {plan["Index Name"]} if "Index Name" in plan else set()
    for child in plan.get("Plans", []):
        used |= _indexes_used(child)
    return used


def _stop_statement_plan(team, run_id: str) -> dict:
    """The plan of the stop's one statement for `run_id` (explained and executed, then undone):
    the statement of a stop of another running run in the same state, naming `run_id`."""
    probe, _lease = make_running(team, ttl=3600)
    with CaptureQueriesContext(connection) as captured:
        services.run_stop(run_id=probe.pk, reason="user_stop", actor=AGENT)
    [stop_sql] = [q["sql"] for q in captured.captured_queries if "frozen AS (SELECT" in q["sql"]]
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + stop_sql.replace(probe.pk, run_id)
            )
            (plan,) = cursor.fetchone()
        transaction.set_rollback(True)
    return (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]


def _with_pending(team, count: int):
    run, _lease = make_running(team, ttl=3600)
    pending = _sent_items(run, count)
    for item in pending:
        item.status = OutboxStatus.PENDING
    OutboxItem.objects.bulk_create(pending, batch_size=2_000)
    return run


def test_a_stops_statement_reads_a_bounded_amount_for_2000_or_20000_pending_items(team, settings):
    """Freezing by epoch: the stop writes no outbox row and counts what it froze only up to a
    cap, so what its statement touches does not grow with the queue (docs/BENCHMARKS.md)."""
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]
    small, big = _with_pending(team, 2_000), _with_pending(team, 20_000)
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboxItem._meta.db_table}")

    small_plan, big_plan = _stop_statement_plan(team, small.pk), _stop_statement_plan(team, big.pk)

    def touched(plan: dict) -> int:
        return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]

    # Rewriting 20,000 rows touches thousands of buffers (a new version of each, two index
    # entries each); the stop stays under a couple of hundred for both, whichever path
    # PostgreSQL takes to the first 1,001 rows it counts (that depends on the statistics).
    assert touched(small_plan) < 200, small_plan
    assert touched(big_plan) < 200, big_plan


def test_the_stop_counts_through_its_own_runs_index_not_the_dispatch_queue(team, settings):
    """A big relabel leaves a dead entry per frozen item in `outbox_pending_idx` until VACUUM;
    the next stops must not read them (they did: 28 ms a stop after 1.2M, BENCHMARKS.md)."""
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]
    big = _with_pending(team, 20_000)
    services.run_stop(run_id=big.pk, reason="user_stop", actor=AGENT)
    while services.outbox_relabel_frozen(run_id=big.pk):  # 20,000 dead entries
        pass
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {OutboxItem._meta.db_table}")
    next_one, _lease = make_running(team, ttl=3600)

    top = _stop_statement_plan(team, next_one.pk)

    used = _indexes_used(top)
    assert "outbox_pending_run_idx" in used and "outbox_pending_idx" not in used, used
    assert top["Shared Hit Blocks"] + top["Shared Read Blocks"] < 60, top
