"""Ingestion: `POST /api/v1/runs/{id}/events/` in batches of 100 and one event per request.

Each client is an agent with its own leased run (agents report their own runs), an httpx
client with the agent token, talking to daphne over loopback. A batch is what a worker sends
for a stretch of work: 45 steps started and completed (in order), 5 artifacts, 5 checkpoints.
Single-event requests alternate `step.started` / `step.completed`.

The baseline writes *the same rows* with raw psycopg, with the same number of commits and the
same concurrency: per batch, one transaction inserting the 45 step rows (in their final
state), 5 artifacts, 5 checkpoints and 100 event receipts with `executemany`; per single event,
one transaction inserting its receipt and inserting (started) or updating (completed) its step.
The ratio API / raw says what everything else costs: HTTP, auth, the rate limit, validation,
the run lock, per-event checks and the change notification.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.common import Row, rate_row, summary
from bench.stack import Stack

BATCH = 100
STEPS_PER_BATCH = 45
ARTIFACTS_PER_BATCH = 5
CHECKPOINTS_PER_BATCH = 5


def batch_events(client: int, batch: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for n in range(STEPS_PER_BATCH):
        key = f"b{batch}-s{n}"
        events.append(
            {
                "event_id": f"c{client}-b{batch}-s{n}-start",
                "type": "step.started",
                "key": key,
                "name": f"Read ticket page {n}",
                "kind": "tool_read",
            }
        )
        events.append(
            {
                "event_id": f"c{client}-b{batch}-s{n}-done",
                "type": "step.completed",
                "key": key,
                "detail": {"tokens": 512 + n, "summary": "ok"},
            }
        )
    for n in range(ARTIFACTS_PER_BATCH):
        events.append(
            {
                "event_id": f"c{client}-b{batch}-a{n}",
                "type": "artifact.added",
                "name": f"notes-{batch}-{n}.md",
                "kind": "text/markdown",
                "uri": f"s3://bench/notes/{client}/{batch}/{n}.md",
                "checksum": "sha256:" + "ab" * 32,
                "reusable": True,
            }
        )
    for n in range(CHECKPOINTS_PER_BATCH):
        events.append(
            {
                "event_id": f"c{client}-b{batch}-k{n}",
                "type": "checkpoint.saved",
                "label": f"checkpoint_{batch:03d}_{n}",
                "state": {"cursor": batch * 100 + n, "open": [1, 2]},
            }
        )
    assert len(events) == BATCH
    return events


def single_event(client: int, index: int) -> dict[str, Any]:
    key = f"single-{index // 2}"
    if index % 2 == 0:
        return {
            "event_id": f"c{client}-single-{index}",
            "type": "step.started",
            "key": key,
            "name": "Call the model",
            "kind": "model_call",
        }
    return {
        "event_id": f"c{client}-single-{index}",
        "type": "step.completed",
        "key": key,
        "detail": {"tokens": 900},
    }


# --------------------------------------------------------------------------------------------
# the API side


def _leased_runs(stack: Stack, count: int, label: str) -> list[tuple[str, int]]:
    from runs import services
    from runs.actors import Actor
    from runs.models import Team

    team = Team.objects.get(pk=stack.team_id)
    system = Actor.system("bench")
    runs = []
    for index in range(count):
        run = services.run_create(
            team=team, title=f"Ingest {label} {index}", agent="ingest-agent", actor=system
        )
        lease = services.lease_acquire(
            run_id=run.pk, worker_id=f"ingest-{index}", ttl_seconds=3600, actor=system
        )
        runs.append((run.pk, lease.epoch))
    return runs


def _run_clients(
    count: int, work: Callable[[int], tuple[int, list[float]]]
) -> tuple[float, int, list[float]]:
    """Start `count` client threads together; (wall seconds, items done, request latencies ms)."""
    results: list[tuple[int, list[float]] | None] = [None] * count
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)

    def body(index: int) -> None:
        try:
            barrier.wait()
            results[index] = work(index)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=body, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise errors[0]
    done = sum(result[0] for result in results if result)
    latencies = [ms for result in results if result for ms in result[1]]
    return wall, done, latencies


def api_batches(
    stack: Stack,
    clients: int,
    batches: int,
    time_limit: float,
    base_urls: list[str] | None = None,
    events_for: Callable[[int, int], list[dict[str, Any]]] | None = None,
) -> tuple[float, int, list[float]]:
    """`events_for(client, batch)`: the batch's 100 events (default `batch_events`)."""
    make_events = events_for or batch_events
    runs = _leased_runs(stack, clients, f"batch-c{clients}")
    urls = base_urls or [stack.base_url]

    def work(index: int) -> tuple[int, list[float]]:
        run_id, epoch = runs[index]
        latencies: list[float] = []
        accepted = 0
        deadline = time.perf_counter() + time_limit
        with httpx.Client(
            base_url=urls[index % len(urls)],
            headers={"Authorization": f"Bearer {stack.agent_token}"},
            timeout=30,
        ) as http:
            for batch in range(batches):
                if time.perf_counter() > deadline:
                    break
                body = {"epoch": epoch, "events": make_events(index, batch)}
                started = time.perf_counter()
                response = http.post(f"/api/v1/runs/{run_id}/events/", json=body)
                latencies.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200:
                    raise RuntimeError(
                        f"events batch answered {response.status_code}: {response.text[:300]}"
                    )
                answer = response.json()
                if answer["accepted"] != BATCH:
                    raise RuntimeError(
                        f"only {answer['accepted']} of {BATCH} accepted: {answer['results'][:3]}"
                    )
                accepted += answer["accepted"]
        return accepted, latencies

    return _run_clients(clients, work)


def api_singles(
    stack: Stack, clients: int, requests: int, time_limit: float, base_urls: list[str] | None = None
) -> tuple[float, int, list[float]]:
    runs = _leased_runs(stack, clients, f"single-c{clients}")
    urls = base_urls or [stack.base_url]

    def work(index: int) -> tuple[int, list[float]]:
        run_id, epoch = runs[index]
        latencies: list[float] = []
        accepted = 0
        deadline = time.perf_counter() + time_limit
        with httpx.Client(
            base_url=urls[index % len(urls)],
            headers={"Authorization": f"Bearer {stack.agent_token}"},
            timeout=30,
        ) as http:
            for number in range(requests):
                if time.perf_counter() > deadline:
                    break
                body = {"epoch": epoch, "events": [single_event(index, number)]}
                started = time.perf_counter()
                response = http.post(f"/api/v1/runs/{run_id}/events/", json=body)
                latencies.append((time.perf_counter() - started) * 1000)
                if response.status_code != 200 or response.json()["accepted"] != 1:
                    raise RuntimeError(
                        f"single event answered {response.status_code}: {response.text[:300]}"
                    )
                accepted += 1
        return accepted, latencies

    return _run_clients(clients, work)


def api_floor(stack: Stack, clients: int, requests: int) -> tuple[float, int, list[float]]:
    """The HTTP floor: daphne + Django's middleware answering a JSON 404 (no auth, no database).
    No API request can be cheaper; it bounds what any hot-path work could reach."""

    def work(index: int) -> tuple[int, list[float]]:
        latencies: list[float] = []
        with httpx.Client(base_url=stack.base_url, timeout=30) as http:
            for _ in range(requests):
                started = time.perf_counter()
                response = http.get("/api/v1/no-such-endpoint/")
                latencies.append((time.perf_counter() - started) * 1000)
                if response.status_code != 404:
                    raise RuntimeError(f"floor request answered {response.status_code}")
        return requests, latencies

    return _run_clients(clients, work)


# --------------------------------------------------------------------------------------------
# the raw psycopg baseline: the same rows, the same number of commits


STEP_SQL = (
    "INSERT INTO runs_step (run_id, seq, key, name, kind, status, epoch, detail, reported_after_stop, "
    "created_at, started_at, finished_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, false, %s, %s, %s)"
)
STEP_DONE_SQL = (
    "UPDATE runs_step SET status = 'completed', finished_at = %s, detail = %s "
    "WHERE run_id = %s AND key = %s"
)
RECEIPT_SQL = (
    "INSERT INTO runs_eventreceipt (run_id, event_id, type, epoch, outcome, code, received_at) "
    "VALUES (%s, %s, %s, %s, 'accepted', '', %s)"
)
ARTIFACT_SQL = (
    "INSERT INTO runs_artifact (run_id, step_id, name, kind, uri, content, checksum, reusable, evidence, "
    "epoch, created_at) VALUES (%s, NULL, %s, %s, %s, '', %s, %s, false, %s, %s)"
)
CHECKPOINT_SQL = (
    "INSERT INTO runs_checkpoint (run_id, step_seq, label, state, epoch, created_at) "
    "VALUES (%s, NULL, %s, %s, %s, %s)"
)


def _raw_runs(stack: Stack, count: int, label: str) -> list[str]:
    from runs.models import Run

    return [
        Run.objects.create(team_id=stack.team_id, title=f"Raw {label} {index}", agent="raw").pk
        for index in range(count)
    ]


def _connect() -> Any:
    import psycopg
    from django.db import connection

    params = connection.get_connection_params()
    return psycopg.connect(
        **{
            key: value
            for key, value in params.items()
            if key in ("dbname", "user", "password", "host", "port")
        }
    )


def raw_batches(stack: Stack, clients: int, batches: int) -> tuple[float, int, list[float]]:
    from psycopg.types.json import Jsonb

    runs = _raw_runs(stack, clients, f"batch-c{clients}")

    def work(index: int) -> tuple[int, list[float]]:
        run_id = runs[index]
        latencies: list[float] = []
        rows = 0
        with _connect() as conn:
            for batch in range(batches):
                events = batch_events(index, batch)
                now = datetime.now(UTC)
                started = time.perf_counter()
                with conn.transaction(), conn.cursor() as cursor:
                    steps = [event for event in events if event["type"] == "step.completed"]
                    cursor.executemany(
                        STEP_SQL,
                        [
                            (
                                run_id,
                                batch * STEPS_PER_BATCH + seq + 1,
                                event["key"],
                                f"Read ticket page {seq}",
                                "tool_read",
                                "completed",
                                1,
                                Jsonb(event["detail"]),
                                now,
                                now,
                                now,
                            )
                            for seq, event in enumerate(steps)
                        ],
                    )
                    cursor.executemany(
                        ARTIFACT_SQL,
                        [
                            (
                                run_id,
                                event["name"],
                                event["kind"],
                                event["uri"],
                                event["checksum"],
                                True,
                                1,
                                now,
                            )
                            for event in events
                            if event["type"] == "artifact.added"
                        ],
                    )
                    cursor.executemany(
                        CHECKPOINT_SQL,
                        [
                            (run_id, event["label"], Jsonb(event["state"]), 1, now)
                            for event in events
                            if event["type"] == "checkpoint.saved"
                        ],
                    )
                    cursor.executemany(
                        RECEIPT_SQL,
                        [(run_id, event["event_id"], event["type"], 1, now) for event in events],
                    )
                latencies.append((time.perf_counter() - started) * 1000)
                rows += len(events)
        return rows, latencies

    return _run_clients(clients, work)


def raw_singles(stack: Stack, clients: int, requests: int) -> tuple[float, int, list[float]]:
    from psycopg.types.json import Jsonb

    runs = _raw_runs(stack, clients, f"single-c{clients}")

    def work(index: int) -> tuple[int, list[float]]:
        run_id = runs[index]
        latencies: list[float] = []
        with _connect() as conn:
            for number in range(requests):
                event = single_event(index, number)
                now = datetime.now(UTC)
                started = time.perf_counter()
                with conn.transaction(), conn.cursor() as cursor:
                    if event["type"] == "step.started":
                        cursor.execute(
                            STEP_SQL,
                            (
                                run_id,
                                number // 2 + 1,
                                event["key"],
                                event["name"],
                                event["kind"],
                                "running",
                                1,
                                Jsonb({}),
                                now,
                                now,
                                None,
                            ),
                        )
                    else:
                        cursor.execute(
                            STEP_DONE_SQL, (now, Jsonb(event["detail"]), run_id, event["key"])
                        )
                    cursor.execute(RECEIPT_SQL, (run_id, event["event_id"], event["type"], 1, now))
                latencies.append((time.perf_counter() - started) * 1000)
        return requests, latencies

    return _run_clients(clients, work)


# --------------------------------------------------------------------------------------------


def run(stack: Stack) -> list[Row]:
    rows: list[Row] = []
    # Warm daphne and the connection paths, then give the planner statistics, as autovacuum
    # would on a live database: on never-analyzed tables PostgreSQL looks a step up by scanning
    # every step of the run (the run_id index) instead of the unique (run_id, key) index.
    from bench.fixtures import analyze

    api_batches(stack, 1, 3, 10)
    api_singles(stack, 1, 20, 10)
    analyze("runs_step", "runs_eventreceipt", "runs_artifact", "runs_checkpoint", "runs_run")
    for clients in (1, 4):
        batches = stack.n(100 if clients == 4 else 40, 8)
        wall, events, latencies = api_batches(
            stack, clients, batches // clients if clients > 1 else batches, 60
        )
        raw_wall, raw_rows, _ = raw_batches(
            stack, clients, batches // clients if clients > 1 else batches
        )
        api_rate, raw_rate = events / wall, raw_rows / raw_wall
        rows.append(
            rate_row(
                "ingest",
                f"events/s, batches of {BATCH}, {clients} client{'s' if clients > 1 else ''}",
                api_rate,
                "events/s",
                minimum=2000 if clients == 4 else None,
                extra={
                    "count": events,
                    **{key: value for key, value in summary(latencies).items() if key != "count"},
                    "raw_rate": raw_rate,
                    "ratio_to_raw": api_rate / raw_rate,
                },
                note=f"raw psycopg, same rows and commits: {raw_rate:,.0f} rows/s → API at {api_rate / raw_rate:.1%} of raw;"
                f" latency columns are per 100-event request (ms)",
            )
        )
    for clients in (1, 4):
        requests = stack.n(1200 if clients == 4 else 500, 80)
        per_client = requests // clients
        wall, done, latencies = api_singles(stack, clients, per_client, 60)
        raw_wall, raw_done, _ = raw_singles(stack, clients, per_client)
        api_rate, raw_rate = done / wall, raw_done / raw_wall
        rows.append(
            rate_row(
                "ingest",
                f"single-event requests/s, {clients} client{'s' if clients > 1 else ''}",
                api_rate,
                "req/s",
                minimum=250 if clients == 4 else None,
                extra={
                    "count": done,
                    **{key: value for key, value in summary(latencies).items() if key != "count"},
                    "raw_rate": raw_rate,
                    "ratio_to_raw": api_rate / raw_rate,
                },
                note=f"raw psycopg, one commit per event: {raw_rate:,.0f} commits/s → API at {api_rate / raw_rate:.1%} of raw;"
                f" latency columns are per request (ms)",
            )
        )
    for clients in (1, 4):
        requests = stack.n(1200, 80)
        wall, done, latencies = api_floor(stack, clients, requests // clients)
        rows.append(
            rate_row(
                "ingest",
                f"HTTP floor: a JSON 404 (no auth, no database), {clients} client{'s' if clients > 1 else ''}",
                done / wall,
                "req/s",
                extra={
                    "count": done,
                    **{key: value for key, value in summary(latencies).items() if key != "count"},
                },
                note="what daphne and Django's middleware alone cost per request: the ceiling of any API endpoint",
            )
        )
    rows += _ratios(stack)
    if os.environ.get("BENCH_INGEST_SCALE_OUT", "1") != "0":
        rows += _scale_out(stack)
    return rows


# Targets: single events at >= 50 % of the HTTP floor, batches at >= 25 % of raw psycopg.
SINGLE_TO_FLOOR_TARGET = 0.50
BATCH_TO_RAW_TARGET = 0.25


def _ratios(stack: Stack) -> list[Row]:
    """Both ratios in interleaved rounds (API, then its reference, then again):
    on a shared machine the load moves within a minute, and a ratio of two figures taken a
    minute apart measures the load as much as the code. Each round is 4 clients on the one
    daphne process; the row gives the median round's ratio and every round's in the note."""
    rounds = stack.n(int(os.environ.get("BENCH_INGEST_RATIO_ROUNDS", "5")), 2)
    singles, floors, batches, raws = [], [], [], []
    for _ in range(rounds):
        wall, done, _latencies = api_singles(stack, 4, stack.n(60, 10), 30)
        singles.append(done / wall)
        wall, done, _latencies = api_floor(stack, 4, stack.n(60, 10))
        floors.append(done / wall)
        wall, done, _latencies = api_batches(stack, 4, stack.n(6, 2), 60)
        batches.append(done / wall)
        wall, done, _latencies = raw_batches(stack, 4, stack.n(6, 2))
        raws.append(done / wall)
    single_ratios = [api / floor for api, floor in zip(singles, floors, strict=True)]
    batch_ratios = [api / raw for api, raw in zip(batches, raws, strict=True)]
    return [
        _ratio_row(
            "single-event requests / HTTP floor, 4 clients, interleaved rounds",
            single_ratios,
            SINGLE_TO_FLOOR_TARGET,
            f"req/s single events {_rates(singles)} vs floor {_rates(floors)}",
        ),
        _ratio_row(
            "batches of 100 / raw psycopg (same rows, same commits), 4 clients, interleaved rounds",
            batch_ratios,
            BATCH_TO_RAW_TARGET,
            f"events/s API {_rates(batches)} vs raw rows/s {_rates(raws)}",
        ),
    ]


def _ratio_row(metric: str, ratios: list[float], target: float, rates: str) -> Row:
    median = statistics.median(ratios)
    return Row(
        "ingest",
        metric,
        {"rate": median * 100, "ratios": ratios},
        "%",
        f"≥ {target:.0%}",
        median * 100,
        median >= target,
        f"median of {len(ratios)} rounds; rounds {', '.join(f'{r:.0%}' for r in ratios)}; {rates}",
    )


def _rates(rates: list[float]) -> str:
    return "/".join(f"{rate:,.0f}" for rate in rates)


def _scale_out(stack: Stack) -> list[Row]:
    """DESIGN §8's scale-out, on this machine: a second daphne process on the same database and
    Redis, the four clients split between the two (as a proxy would). Same workloads."""
    from bench.common import PYTHON, free_port, start, wait_for_port

    port = free_port()
    second = start(
        "daphne-2",
        [PYTHON, "manage.py", "serve", "--no-demo", "--host", "127.0.0.1", "--port", str(port)],
        stack.env,
        stack.log_dir,
    )
    rows: list[Row] = []
    try:
        wait_for_port(port, timeout=60, process=second.process)
        urls = [stack.base_url, f"http://127.0.0.1:{port}"]
        api_singles(stack, 2, 20, 10, base_urls=urls)  # warm the second process
        batches = stack.n(100, 8)
        wall, events, latencies = api_batches(stack, 4, batches // 4, 60, base_urls=urls)
        rows.append(
            rate_row(
                "ingest",
                "events/s, batches of 100, 4 clients, 2 daphne processes",
                events / wall,
                "events/s",
                extra={
                    "count": events,
                    **{key: value for key, value in summary(latencies).items() if key != "count"},
                },
            )
        )
        requests = stack.n(1200, 80)
        wall, done, latencies = api_singles(stack, 4, requests // 4, 60, base_urls=urls)
        rows.append(
            rate_row(
                "ingest",
                "single-event requests/s, 4 clients, 2 daphne processes",
                done / wall,
                "req/s",
                extra={
                    "count": done,
                    **{key: value for key, value in summary(latencies).items() if key != "count"},
                },
            )
        )
    finally:
        second.stop()
    return rows
