"""Policies (DESIGN §14): what checking 50 enabled policies adds to a permit and to an events
batch, and a policy's stop latency.

1. permit — `services.permit_request` (what the API's permit view calls), in this process on
   PostgreSQL, each on its own running run, first with no policy on the team, then with 50
   enabled policies (the six templates' shapes at thresholds no run reaches, so all 50 are
   evaluated and none acts). What the policies add is timed where it happens: the policy
   checks runs calls inside the permit's transaction (`runs.hooks.policies()`), wrapped in a
   clock — their queries (the team's policies, the run's facts) included. The whole permit's
   latency is reported beside it; on a shared machine its spread hides a millisecond.
2. events batch — `services.events_ingest` with a 10-event batch (steps started and completed,
   usage reports), the same two ways.
3. policy stop latency — from the start of the fact that breaks a policy (the permit that
   repeats a call for the fifth time) to the stop signal handed to the channel layer on commit
   (a `runs.notify` listener after the Channels publisher; CLOCK_MONOTONIC). The permit is
   refused in the same transaction.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \\
        .venv/bin/python bench/bench_policies.py [--n 400] [--keep-db]

on its own database `safestop_bench_policies` (dropped at the end unless --keep-db).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    Row,
    drop_database,
    format_table,
    format_targets,
    latency_row,
    percentile,
    recreate_database,
    with_database,
)

DB_NAME = "safestop_bench_policies"
COMMAND = "DATABASE_URL=… .venv/bin/python bench/bench_policies.py"
SECTION = "policies"

# 50 policies of the six templates' shapes, each at a threshold no bench run reaches.
SHAPES = (
    "run.tool_failures_in_a_row >= {n}",
    "call.repeats >= {n}",
    'call.side_effect == "write" && call.destination_host != "" && '
    '!(call.destination_host in ["api.example.com", "api{n}.example.org"])',
    "run.cost_usd > {n}.0",
    "run.elapsed_seconds > {n}000.0",
    "run.side_effects_last_minute > {n}",
)


CHECK_TIMES: dict[str, list[float]] = {
    "permit": [],
    "events": [],
    "permit_cpu": [],
    "events_cpu": [],
}


def _install_clock() -> None:
    """Time the policy checks inside the runs transactions that call them."""
    from policies.evaluate import Checks
    from runs import hooks

    class Timed(Checks):
        def permit(self, run: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                return super().permit(run, **kwargs)
            finally:
                CHECK_TIMES["permit"].append((time.perf_counter() - started) * 1000)
                CHECK_TIMES["permit_cpu"].append((time.thread_time() - cpu) * 1000)

        def events(self, run: Any, event_types: list[str], **kwargs: Any) -> None:
            started, cpu = time.perf_counter(), time.thread_time()
            try:
                super().events(run, event_types, **kwargs)
            finally:
                CHECK_TIMES["events"].append((time.perf_counter() - started) * 1000)
                CHECK_TIMES["events_cpu"].append((time.thread_time() - cpu) * 1000)

    hooks.register_policies(Timed())


def _setup(admin_url: str) -> None:
    recreate_database(admin_url, DB_NAME)
    os.environ.update(
        DATABASE_URL=with_database(admin_url, DB_NAME),
        DJANGO_SETTINGS_MODULE="console.settings",
        SAFESTOP_LOG_LEVEL="WARNING",
    )
    os.environ.pop("REDIS_URL", None)  # the in-memory channel layer: no Redis hop measured
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _runs(team: Any, count: int) -> list[Any]:
    from runs import services
    from runs.actors import Actor

    system = Actor.system("bench")
    made = []
    for n in range(count):
        run = services.run_create(team=team, title=f"bench {n}", agent="bench-bot", actor=system)
        services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=600, actor=system)
        made.append(run)
    return made


def _permits(runs: list[Any], tag: str) -> list[float]:
    from runs import services
    from runs.actors import Actor

    agent = Actor("api_client", "1", "bench-agent")
    samples = []
    for index, run in enumerate(runs):
        started = time.perf_counter()
        services.permit_request(
            run_id=run.pk,
            epoch=1,
            tool_call_id=f"{tag}-{index}",
            tool="search",
            arguments={"q": f"{tag} {index}", "url": "https://api.example.com/x"},
            side_effect="write",
            actor=agent,
        )
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _batches(runs: list[Any], tag: str) -> list[float]:
    from runs import services
    from runs.actors import Actor

    agent = Actor("api_client", "1", "bench-agent")
    samples = []
    for index, run in enumerate(runs):
        events: list[dict[str, Any]] = []
        for step in range(4):
            key = f"{tag}-{index}-{step}"
            events.append({"event_id": f"{key}-s", "type": "step.started", "key": key})
            events.append({"event_id": f"{key}-c", "type": "step.completed", "key": key})
        events.append(
            {
                "event_id": f"{tag}-{index}-u1",
                "type": "usage",
                "model": "gpt-4o",
                "input_tokens": 100,
                "output_tokens": 20,
                "cost_usd": 0.001,
            }
        )
        events.append(
            {
                "event_id": f"{tag}-{index}-u2",
                "type": "usage",
                "model": "gpt-4o",
                "input_tokens": 100,
                "output_tokens": 20,
                "cost_usd": 0.001,
            }
        )
        started = time.perf_counter()
        services.events_ingest(run_id=run.pk, epoch=1, events=events, actor=agent)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _stop_latency(team: Any, count: int) -> list[float]:
    from policies.services import policy_create
    from runs import notify, services
    from runs.actors import Actor
    from runs.errors import RunNotRunning

    policy_create(
        team_id=team.pk,
        actor=Actor.system("bench"),
        name="bench-loop",
        expression="call.repeats >= 5",
        action="stop",
        mode="enforce",
    )
    signalled: dict[str, float] = {}

    def clock(event: dict[str, Any]) -> None:
        if event.get("kind") == "stop_signal":
            signalled.setdefault(event["run_id"], time.perf_counter())

    notify.subscribe(clock)  # after the Channels publisher: the signal is on its way
    agent = Actor("api_client", "1", "bench-agent")
    samples = []
    for run in _runs(team, count):
        for n in range(4):
            services.permit_request(
                run_id=run.pk,
                epoch=1,
                tool_call_id=f"l{n}",
                tool="fetch",
                arguments={"page": 1},
                actor=agent,
            )
        started = time.perf_counter()
        try:
            services.permit_request(
                run_id=run.pk,
                epoch=1,
                tool_call_id="l5",
                tool="fetch",
                arguments={"page": 1},
                actor=agent,
            )
        except RunNotRunning:
            pass
        samples.append((signalled[run.pk] - started) * 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--keep-db", action="store_true")
    args = parser.parse_args()
    admin_url = os.environ.get("DATABASE_URL", "")
    if not admin_url.startswith("postgres"):
        sys.exit("bench_policies needs DATABASE_URL=postgres://...")
    _setup(admin_url)
    try:
        rows = _measure(args.n)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            drop_database(admin_url, DB_NAME)
    print(format_table(rows))
    print()
    print(format_targets(rows))


def _measure(n: int) -> list[Row]:
    from policies.services import policy_create
    from runs.actors import Actor
    from runs.tokens import team_ensure

    _install_clock()
    team = team_ensure(slug="bench", name="Bench")
    runs = _runs(team, n)
    _permits(runs[:20], "warm")  # connections, caches, the first compile
    CHECK_TIMES["permit"].clear()
    bare_permit = _permits(runs, "bare")
    bare_batch = _batches(runs, "bare")
    bare_checks = {kind: list(times) for kind, times in CHECK_TIMES.items()}
    admin = Actor.system("bench")
    for index in range(50):
        shape = SHAPES[index % len(SHAPES)]
        policy_create(
            team_id=team.pk,
            actor=admin,
            name=f"p{index}",
            expression=shape.format(n=1000 + index),
            action="stop",
            mode="enforce",
        )
    _permits(runs[:20], "warm50")
    for times in CHECK_TIMES.values():
        times.clear()
    with_permit = _permits(runs, "fifty")
    with_batch = _batches(runs, "fifty")
    checks = {kind: list(times) for kind, times in CHECK_TIMES.items()}
    stops = _stop_latency(team_ensure(slug="bench-stop", name="Bench stop"), max(n // 4, 50))
    rows = [
        latency_row(SECTION, "permit, no policy", bare_permit),
        latency_row(SECTION, "permit, 50 enabled policies", with_permit),
        latency_row(SECTION, "events batch (10 events), no policy", bare_batch),
        latency_row(SECTION, "events batch (10 events), 50 enabled policies", with_batch),
        latency_row(
            SECTION,
            "permit: the policy checks inside it, no policy (the facts kept)",
            bare_checks["permit"],
        ),
        latency_row(
            SECTION,
            "events batch: the policy checks inside it, no policy",
            bare_checks["events"],
        ),
        latency_row(
            SECTION,
            "permit: added by 50 enabled policies (the checks inside it)",
            checks["permit"],
            target_key="p99",
            target_ms=1,
        ),
        latency_row(
            SECTION,
            "events batch: added by 50 enabled policies (the checks inside it)",
            checks["events"],
            target_key="p99",
            target_ms=1,
        ),
        latency_row(
            SECTION,
            "permit: CPU time of the checks, 50 enabled policies",
            checks["permit_cpu"],
        ),
        latency_row(
            SECTION,
            "events batch: CPU time of the checks, 50 enabled policies",
            checks["events_cpu"],
        ),
        _added("permit: p99 with − p99 without (whole permit)", bare_permit, with_permit),
        _added("events batch: p99 with − p99 without (whole batch)", bare_batch, with_batch),
        latency_row(
            SECTION,
            "policy stop: breaking fact → stop signal",
            stops,
            target_key="p99",
            target_ms=20,
        ),
    ]
    for row in rows:
        row.command = COMMAND
    return rows


def _added(metric: str, bare: list[float], with_policies: list[float]) -> Row:
    added = (percentile(with_policies, 0.99) or 0) - (percentile(bare, 0.99) or 0)
    p50 = (percentile(with_policies, 0.5) or 0) - (percentile(bare, 0.5) or 0)
    return Row(
        SECTION,
        metric,
        {"p50_ms": round(p50, 3), "p99_ms": round(added, 3)},
        "ms",
        note="a difference of two noisy p99s; the row above times the checks themselves",
    )


if __name__ == "__main__":
    main()
