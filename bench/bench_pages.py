"""Pages: server time and query counts of the console's heaviest pages.

Fixtures are written with COPY (bench/fixtures.py), not through the services, to keep setup
fast — but shaped like real traffic:
- 100,000 runs over 120 days, 5 teams, 20 agents, statuses weighted as a busy console sees them;
- one run with 5,000 steps, 2,000 tool calls (a fifth of them writes), 300 outbox items,
  300 artifacts, 100 checkpoints, queued steering and a 4,000-entry valid ledger chain; it is then
  stopped *through the services* (stop + drain), so its stop packet is the real one: a dirty stop
  with three calls in flight, five dispatches in flight and frozen items;
- the same shape with 10 steps, to show the query count does not grow with the run.

Each page is requested in this process through Django's test client as a logged-in user (the
whole middleware stack, no network): that is the server time. Query counts come from one extra
request under CaptureQueriesContext.

The runs page alone over 1,000,000 runs, standalone on its own database,
which it keeps so the next measurement does not pay for the fixtures again:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python bench/bench_pages.py [--runs 1000000] [--iterations 40] [--fresh]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, format_table, latency_row  # noqa: E402
from bench.stack import Stack  # noqa: E402

RUNS = 100_000
BIG_STEPS = 5_000


def _teams(team_id: int) -> list[int]:
    from runs.tokens import team_ensure

    return [team_id] + [
        team_ensure(slug=f"bench-{name}", name=name.title()).pk
        for name in ("north", "south", "east", "west")
    ]


def load_runs(team_id: int, count: int) -> float:
    from bench.fixtures import analyze, copy_rows, run_rows, stop_request_rows
    from runs.dispatch import fence_overdue_stops
    from runs.models import Run, StopRequest

    started = time.perf_counter()
    stopped: list[dict[str, Any]] = []

    team_ids = _teams(team_id)  # before the COPY: the connection runs nothing else during it

    def rows() -> Iterable[dict[str, Any]]:
        for row in run_rows(count, team_ids=team_ids):
            if row["stop_requested_at"] is not None:
                stopped.append(row)
            yield row

    copy_rows(Run, rows())
    copy_rows(StopRequest, stop_request_rows(stopped))
    # The fixture's "stopping" runs stopped long ago: past the drain deadline. Let the watchdog
    # settle them now, as it would have, rather than in the background of the measurements.
    while fence_overdue_stops():
        pass
    analyze(Run._meta.db_table, StopRequest._meta.db_table, vacuum=True)
    return time.perf_counter() - started


def build_run(stack: Stack, steps: int, *, seed: int) -> tuple[str, int, dict[str, float]]:
    """A run with `steps` steps and everything around it, stopped through the services.
    Returns (run id, stop epoch, timings of the stop)."""
    from django.db import transaction
    from django.utils import timezone

    from bench.fixtures import copy_rows
    from runs import services
    from runs.actors import Actor
    from runs.ledger import GENESIS_HASH, KEYED_HASH, _canonical, _timestamp, entry_hash
    from runs.ledger_keys import signing_key
    from runs.models import (
        Artifact,
        Checkpoint,
        ExecutionRecord,
        LedgerEntry,
        OutboxItem,
        Run,
        SteeringMessage,
        Step,
        Team,
    )

    rng = random.Random(seed)
    system = Actor.system("bench")
    team = Team.objects.get(pk=stack.team_id)
    run = services.run_create(
        team=team,
        title=f"Migrate tenant archive ({steps} steps)",
        agent="migration-agent",
        actor=system,
    )
    lease = services.lease_acquire(
        run_id=run.pk, worker_id="migrator-1", ttl_seconds=3600, actor=system
    )
    epoch = lease.epoch
    base = timezone.now() - timedelta(hours=6)
    kinds = ["model_call", "tool_read", "tool_read", "tool_write", "external_action"]

    def at(seconds: float) -> Any:
        return base + timedelta(seconds=seconds)

    with transaction.atomic():
        copy_rows(
            Step,
            (
                {
                    "run_id": run.pk,
                    "seq": seq,
                    "key": f"step-{seq:05d}",
                    "name": f"Copy archive chunk {seq}",
                    "kind": kinds[seq % len(kinds)],
                    "status": "completed" if seq <= steps - 3 else "running",
                    "epoch": epoch,
                    "detail": {"rows": rng.randint(100, 5000), "chunk": seq},
                    "started_at": at(seq * 4),
                    "finished_at": at(seq * 4 + 3) if seq <= steps - 3 else None,
                }
                for seq in range(1, steps + 1)
            ),
        )
        step_ids = dict(Step.objects.filter(run_id=run.pk).values_list("seq", "pk"))
        calls = max(3, steps * 2 // 5)
        call_rows = []
        for n in range(calls):
            seq = min(steps, 1 + n * steps // calls)
            write = n % 5 == 0
            in_flight = n >= calls - 3
            call_rows.append(
                {
                    "run_id": run.pk,
                    "step_id": step_ids[seq],
                    "tool_call_id": f"call_{n:05d}",
                    "tool": "write_object" if write else "read_object",
                    "arguments": {"bucket": "archive", "key": f"chunk/{seq}"},
                    "operation_id": f"op-{n}" if write else "",
                    "idempotency_key": f"idem-{n}" if write else "",
                    "side_effect": "write" if write else "none",
                    "permit_epoch": epoch,
                    "execution_state": "running" if in_flight else "succeeded",
                    "side_effect_state": ("pending_verification" if in_flight else "applied")
                    if write
                    else "none",
                    "recovery_policy": "query_original" if write else "manual_confirmation",
                    "last_observation": ""
                    if in_flight
                    else f"copied {rng.randint(1, 900)} objects",
                    "observed_at": None if in_flight else at(seq * 4 + 2),
                    "permitted_at": at(seq * 4 + 1),
                    "finished_at": None if in_flight else at(seq * 4 + 2),
                }
            )
        copy_rows(ExecutionRecord, call_rows)
        outbox = max(10, steps * 3 // 50)
        copy_rows(
            OutboxItem,
            (
                {
                    "run_id": run.pk,
                    "transport": "webhook" if n % 4 else "email",
                    "destination": "https://hooks.bench.test/progress"
                    if n % 4
                    else "ops@bench.test",
                    "payload": {"chunk": n, "status": "copied"},
                    "idempotency_key": f"progress-{n}",
                    "status": "sent"
                    if n < outbox - 50
                    else ("dispatching" if n >= outbox - 5 else "pending"),
                    "enqueue_epoch": epoch,
                    "claim_epoch": epoch if n < outbox - 50 or n >= outbox - 5 else None,
                    "claimed_at": at(n * 10) if n < outbox - 50 or n >= outbox - 5 else None,
                    "claimed_by": "dispatcher-1" if n < outbox - 50 or n >= outbox - 5 else "",
                    "sent_at": at(n * 10 + 1) if n < outbox - 50 else None,
                    "response_status": 200 if n < outbox - 50 else None,
                    "attempts": 1 if n < outbox - 50 or n >= outbox - 5 else 0,
                }
                for n in range(outbox)
            ),
        )
        copy_rows(
            Artifact,
            (
                {
                    "run_id": run.pk,
                    "step_id": step_ids[min(steps, 1 + n * 16)],
                    "name": f"chunk-{n}.manifest.json",
                    "kind": "application/json",
                    "uri": f"s3://bench/manifests/{run.pk}/{n}.json",
                    "checksum": "sha256:" + f"{n:064x}",
                    "reusable": n % 3 == 0,
                    "evidence": n % 10 == 0,
                    "epoch": epoch,
                }
                for n in range(max(3, steps * 3 // 50))
            ),
        )
        copy_rows(
            Checkpoint,
            (
                {
                    "run_id": run.pk,
                    "step_seq": min(steps, n * 50),
                    "label": f"checkpoint_{n:02d}",
                    "state": {"cursor": n * 50, "done": n * 50},
                    "epoch": epoch,
                }
                for n in range(1, max(2, steps // 50) + 1)
            ),
        )
        for text in ("Skip the legacy bucket", "Use the EU endpoint from now on"):
            SteeringMessage.objects.create(run_id=run.pk, author="alice", text=text)
        # the ledger: a permit and a result per call, chained on from what the services wrote
        last = LedgerEntry.objects.filter(run_id=run.pk).order_by("-run_seq").first()
        run_seq, prev = (last.run_seq, last.hash) if last else (0, GENESIS_HASH)
        entries = []
        key = signing_key()
        for row in call_rows:
            for action, payload in (
                (
                    "tool.permitted",
                    {
                        "tool_call_id": row["tool_call_id"],
                        "tool": row["tool"],
                        "side_effect": row["side_effect"],
                        "epoch": epoch,
                    },
                ),
                ("tool.result", {"tool_call_id": row["tool_call_id"], "reported": "succeeded"}),
            ):
                run_seq += 1
                stamp = timezone.now()
                payload = _canonical(payload)
                digest = entry_hash(
                    key=key,
                    team_slug=team.slug,
                    run_id=run.pk,
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
                entries.append(
                    {
                        "run_id": run.pk,
                        "run_seq": run_seq,
                        "at": stamp,
                        "actor_kind": "api_client",
                        "actor_id": "1",
                        "actor": "bench-agent",
                        "team_slug": team.slug,
                        "action": action,
                        "reason": "",
                        "payload": payload,
                        "prev_hash": prev,
                        "hash": digest,
                        "hash_version": KEYED_HASH,
                        "key_id": key.id,
                    }
                )
                prev = digest
        copy_rows(LedgerEntry, entries)
        Run.objects.filter(pk=run.pk).update(change_seq=run_seq, tool_calls_count=calls)
    timings: dict[str, float] = {}
    reviewer = Actor("user", "0", stack.reviewer_username)
    started = time.perf_counter()
    services.run_stop(
        run_id=run.pk, reason="user_stop", actor=reviewer, note="the migration touches prod buckets"
    )
    timings["stop"] = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    settled = services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=epoch, actor=system
    )
    timings["drain_settle_packet"] = (time.perf_counter() - started) * 1000
    assert settled.status == "stopped_dirty", settled.status
    return run.pk, settled.stop_epoch, timings


def _client(username: str) -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    return client


def _time_page(
    client: Any, url: str, iterations: int, warmup: int = 3
) -> tuple[list[float], int, int]:
    """(server times ms, query count, response bytes)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(warmup):
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"GET {url} answered {response.status_code}")
    samples = []
    for _ in range(iterations):
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    return samples, len(queries.captured_queries), len(response.content)


def runs_page_cases(cursor: str) -> list[tuple[str, str, str]]:
    """(label, who, url): every variant of the runs page a reviewer uses."""
    return [
        ("runs page, staff (every team)", "staff", "/"),
        ("runs page, reviewer (one team)", "reviewer", "/"),
        ("runs page, next page (keyset cursor)", "staff", f"/?after={cursor}"),
        ("runs page, status filter", "staff", "/?status=stopped_dirty"),
        ("runs page, status filter 'completed' (62 %)", "staff", "/?status=completed"),
        ("runs page, agent filter", "staff", "/?agent=refund-agent"),
        ("runs page, team filter", "staff", "/?team=bench-north"),
        ("runs page, search 'refund'", "staff", "/?q=refund"),
        ("runs page, search a rare word", "staff", "/?q=%2342424"),
        ("runs page, search a run id prefix", "staff", "/?q=run_b00000"),
        ("runs page, htmx region refresh", "staff", "/"),
    ]


def runs_page_rows(
    staff_username: str, reviewer_username: str, iterations: int
) -> tuple[list[Row], dict[str, int]]:
    """Times every runs-page variant; returns the rows and each variant's query count."""
    from console.selectors.runs import cursor_encode
    from runs.models import Run

    total_runs = Run.objects.count()
    clients = {"staff": _client(staff_username), "reviewer": _client(reviewer_username)}
    oldest_on_page = list(
        Run.objects.order_by("-created_at", "-pk").values_list("created_at", "pk")[49:50]
    )
    cursor = cursor_encode(*oldest_on_page[0]) if oldest_on_page else ""
    rows: list[Row] = []
    query_counts = {}
    for label, who, url in runs_page_cases(cursor):
        client = clients[who]
        extra = (
            {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "runs-region"} if "htmx" in label else {}
        )
        client.defaults.update(extra)
        samples, queries, size = _time_page(client, url, iterations)
        for key in extra:
            client.defaults.pop(key, None)
        query_counts[label] = queries
        rows.append(
            latency_row(
                "pages",
                f"{label} — {total_runs:,} runs",
                samples,
                target_key="p95",
                target_ms=100,
                figure=f"runs page over {total_runs:,} runs (staff, reviewer, filters, search, htmx)",
                note=f"{queries} queries, {size / 1024:.0f} KiB, load {os.getloadavg()[0]:.1f}",
            )
        )
        # each row as it is measured: a run cut short keeps what it had
        print(format_table(rows[-1:]).splitlines()[-1], rows[-1].note, flush=True)
    return rows, query_counts


def run(stack: Stack) -> list[Row]:
    from runs.models import Run

    load_seconds = load_runs(stack.team_id, stack.n(RUNS, 20_000))
    total_runs = Run.objects.count()
    iterations = stack.n(40, 8)
    rows, _counts = runs_page_rows(stack.staff_username, stack.reviewer_username, iterations)
    staff = _client(stack.staff_username)

    big_id, big_epoch, big_stop = build_run(stack, stack.n(BIG_STEPS, 1000), seed=1)
    small_id, small_epoch, _ = build_run(stack, 10, seed=2)
    from bench.fixtures import analyze

    analyze(
        "runs_step",
        "runs_executionrecord",
        "runs_outboxitem",
        "runs_ledgerentry",
        "runs_artifact",
        "runs_checkpoint",
        "handoff_stoppacket",
        vacuum=True,
    )
    for label, path in (
        ("run page", "/runs/{id}/"),
        ("stop packet page", "/runs/{id}/packets/{epoch}/"),
    ):
        big_samples, big_queries, big_size = _time_page(
            staff, path.format(id=big_id, epoch=big_epoch), iterations
        )
        _small, small_queries, _size = _time_page(
            staff, path.format(id=small_id, epoch=small_epoch), 2, warmup=1
        )
        constant = "constant" if big_queries == small_queries else "NOT constant"
        rows.append(
            latency_row(
                "pages",
                f"{label} — {stack.n(BIG_STEPS, 1000):,} steps",
                big_samples,
                target_key="p95",
                target_ms=300,
                note=f"{big_queries} queries ({small_queries} for a 10-step run: {constant}), {big_size / 1024:.0f} KiB",
            )
        )
    rows.append(
        Row(
            "pages",
            "fixtures",
            {"value": load_seconds},
            "s",
            note=f"COPY of {total_runs:,} runs in {load_seconds:.1f} s; stopping the "
            f"{stack.n(BIG_STEPS, 1000):,}-step run: run_stop {big_stop['stop']:.0f} ms, drained → "
            f"settle + packet {big_stop['drain_settle_packet']:.0f} ms",
        )
    )
    return rows


# --------------------------------------------------------------------------------------------
# standalone: the runs page over 1,000,000 runs, on a database kept between measurements


def _principals_once() -> dict[str, Any]:
    from django.contrib.auth import get_user_model

    from runs.models import Team

    if get_user_model().objects.filter(username="bench-admin").exists():
        return {
            "team_id": Team.objects.get(slug="bench").pk,
            "staff_username": "bench-admin",
            "reviewer_username": "bench-reviewer",
        }
    from bench.run_all import _principals

    return _principals()


def _database_exists(admin_url: str, name: str) -> bool:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return found is not None


def _sample(username: str, url: str, iterations: int) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from bench.common import percentile
    from runs.models import Run

    client = _client(username)
    for _ in range(3):
        client.get(url)
    totals, sql = [], []
    for _ in range(iterations):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            client.get(url)
            totals.append((time.perf_counter() - started) * 1000)
        sql.append(sum(float(query["time"]) for query in queries.captured_queries) * 1000)
    print(
        f"{Run.objects.count():,} runs, {url}: total p50 {percentile(totals, 0.5):.0f} "
        f"p95 {percentile(totals, 0.95):.0f} ms; SQL p50 {percentile(sql, 0.5):.0f} "
        f"p95 {percentile(sql, 0.95):.0f} ms; {len(queries)} queries; "
        f"load {os.getloadavg()[0]:.1f}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="The runs page over a million runs.")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--fresh", action="store_true", help="drop the kept database first")
    parser.add_argument(
        "--sample",
        metavar="URL",
        help="only time this URL as staff on the kept database (total and SQL, p50/p95): run "
        "two at once on two BENCH_DB_NAMEs to compare sizes under the same load",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("BENCH_DB_NAME", "safestop_bench_pages")
    os.environ.setdefault("BENCH_REDIS_DB", "13")
    from bench.common import recreate_database
    from bench.run_all import _environment, _setup_django

    admin_url, db_name, _url, env = _environment(args)
    if args.fresh or not _database_exists(admin_url, db_name):
        recreate_database(admin_url, db_name)
    _setup_django(env)
    principals = _principals_once()
    if args.sample:
        _sample(principals["staff_username"], args.sample, args.iterations)
        return
    from runs.models import Run

    have = Run.objects.count()
    if have < args.runs:
        print(f"loading {args.runs - have:,} runs by COPY ...", flush=True)
        seconds = load_runs(principals["team_id"], args.runs - have)
        print(f"fixtures: {args.runs - have:,} runs in {seconds:.1f} s", flush=True)
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rows, _counts = runs_page_rows(
        principals["staff_username"], principals["reviewer_username"], args.iterations
    )
    print(format_table(rows))
    for row in rows:
        print(f"  - {row.metric}: {row.note}")
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
