"""Policies (DESIGN §14): what checking 50 enabled policies adds to a permit and to an events
batch, and a policy's stop latency.

1. permit — `services.permit_request` (what the API's permit view calls), in this process on
   PostgreSQL, each on its own running run, on two teams alternately: one with no policy, one
   with 50 enabled policies (the six templates' shapes at thresholds no run reaches, so all 50
   are evaluated and none acts). Alternating puts a change of the shared machine's load on
   both sides alike. Timed: the whole permit (wall and process CPU time), and the policy checks
   runs calls inside the permit's transaction (`runs.hooks.policies()`, wall and this thread's
   CPU time; their statements included: the check's read and the facts' write, which a team
   with no policy pays too, so the judged row is an upper bound of what 50 policies add).
2. events batch — `services.events_ingest` with a 10-event batch (steps started and completed,
   usage reports), the same two ways.
3. policy stop latency — the permit that repeats a call for the fifth time breaks
   `call.repeats >= 5` and is refused; timed from its commit, and from its start, to the stop
   signal handed to the channel layer (one `runs.notify` listener before the Channels
   publisher, one after; the in-memory layer, no Redis hop). A reviewer's `run_stop` on a run
   of the same team, alternately, is timed the same way: both go through `stop_locked` and
   the same on-commit push. The process's first stop is reported on its own (see its row).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test \\
        .venv/bin/python bench/bench_policies.py [--n 400] [--keep-db]

on its own database `safestop_bench_policies` (dropped at the end unless --keep-db).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
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


# (team id, "permit" | "events") → wall and CPU (this thread's) milliseconds of each check.
CHECK_TIMES: dict[tuple[int, str], list[float]] = defaultdict(list)
CHECK_CPU: dict[tuple[int, str], list[float]] = defaultdict(list)


def _install_clock() -> None:
    """Time the policy checks inside the runs transactions that call them."""
    from policies.evaluate import Checks
    from runs import hooks

    def timed(kind: str, run: Any, call: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return call()
        finally:
            CHECK_TIMES[run.team_id, kind].append((time.perf_counter() - started) * 1000)
            CHECK_CPU[run.team_id, kind].append((time.thread_time() - cpu) * 1000)

    class Timed(Checks):
        def permit(self, run: Any, **kwargs: Any) -> Any:
            return timed("permit", run, lambda: super(Timed, self).permit(run, **kwargs))

        def events(self, run: Any, event_types: list[str], **kwargs: Any) -> None:
            timed("events", run, lambda: super(Timed, self).events(run, event_types, **kwargs))

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


class Clock:
    """Wall and CPU (process) milliseconds of each operation, by label."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = defaultdict(list)
        self.cpu: dict[str, list[float]] = defaultdict(list)

    def time(self, label: str, call: Any, *args: Any) -> None:
        started, cpu = time.perf_counter(), time.process_time()
        call(*args)
        self.cpu[label].append((time.process_time() - cpu) * 1000)
        self.wall[label].append((time.perf_counter() - started) * 1000)


AGENT_ACTOR: Any = None


def _permit(run: Any, call_id: str, **fields: Any) -> None:
    from runs import services

    services.permit_request(
        run_id=run.pk, epoch=1, tool_call_id=call_id, actor=AGENT_ACTOR, **fields
    )


def _permit_call(run: Any, tag: str, index: int) -> None:
    _permit(
        run,
        f"{tag}-{index}",
        tool="search",
        arguments={"q": f"{tag} {index}", "url": "https://api.example.com/x"},
        side_effect="write",
    )


def _batch(run: Any, tag: str, index: int) -> None:
    from runs import services

    events: list[dict[str, Any]] = []
    for step in range(4):
        key = f"{tag}-{index}-{step}"
        events.append({"event_id": f"{key}-s", "type": "step.started", "key": key})
        events.append({"event_id": f"{key}-c", "type": "step.completed", "key": key})
    for usage in ("u1", "u2"):
        events.append(
            {
                "event_id": f"{tag}-{index}-{usage}",
                "type": "usage",
                "model": "gpt-4o",
                "input_tokens": 100,
                "output_tokens": 20,
                "cost_usd": 0.001,
            }
        )
    services.events_ingest(run_id=run.pk, epoch=1, events=events, actor=AGENT_ACTOR)


def _interleaved(clock: Clock, bare: list[Any], fifty: list[Any], tag: str) -> None:
    """Permits then batches on the two teams' runs, alternating, so a change of the machine's
    load during the bench falls on both sides alike."""
    for index, (a, b) in enumerate(zip(bare, fifty, strict=True)):
        clock.time("permit bare", _permit_call, a, tag, index)
        clock.time("permit fifty", _permit_call, b, tag, index)
    for index, (a, b) in enumerate(zip(bare, fifty, strict=True)):
        clock.time("batch bare", _batch, a, tag, index)
        clock.time("batch fifty", _batch, b, tag, index)


class SignalClock:
    """When each run's stop committed and when its signal was handed to the channel layer: one
    `runs.notify` listener before the Channels publisher, one after (CLOCK_MONOTONIC)."""

    def __init__(self) -> None:
        self.committed: dict[str, float] = {}
        self.signalled: dict[str, float] = {}

    def install(self) -> None:
        from console import realtime
        from runs import notify

        notify.unsubscribe(realtime.publish)
        notify.subscribe(self._commit)
        notify.subscribe(realtime.publish)
        notify.subscribe(self._signal)

    def _commit(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "stop_signal":
            self.committed.setdefault(event["run_id"], time.perf_counter())

    def _signal(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "stop_signal":
            self.signalled.setdefault(event["run_id"], time.perf_counter())


def _stop_latency(team: Any, count: int, signals: SignalClock) -> dict[str, list[float]]:
    """A policy's stop and a reviewer's, alternating on runs of one team: each from the start of
    the call that stops the run (the fifth repeat of a call; `run_stop`) to its signal, and
    from the commit to the signal."""
    from policies.services import policy_create
    from runs import services
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
    reviewer = Actor("user", "1", "bench-reviewer")
    out: dict[str, list[float]] = defaultdict(list)
    for index, (looping, stopped) in enumerate(_pairs(_runs(team, 2 * count))):
        for n in range(4):
            _permit(looping, f"l{n}", tool="fetch", arguments={"page": 1})
        started = time.perf_counter()
        try:
            _permit(looping, "l5", tool="fetch", arguments={"page": 1})
        except RunNotRunning:
            pass
        out["policy"].append((signals.signalled[looping.pk] - started) * 1000)
        out["policy commit"].append(
            (signals.signalled[looping.pk] - signals.committed[looping.pk]) * 1000
        )
        started = time.perf_counter()
        services.run_stop(run_id=stopped.pk, reason="user_stop", actor=reviewer, note=f"{index}")
        out["reviewer"].append((signals.signalled[stopped.pk] - started) * 1000)
        out["reviewer commit"].append(
            (signals.signalled[stopped.pk] - signals.committed[stopped.pk]) * 1000
        )
    return out


def _pairs(runs: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(runs[::2], runs[1::2], strict=True))


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
    global AGENT_ACTOR
    from policies.services import policy_create
    from runs.actors import Actor
    from runs.tokens import team_ensure

    AGENT_ACTOR = Actor("api_client", "1", "bench-agent")
    _install_clock()
    signals = SignalClock()
    signals.install()
    bare_team = team_ensure(slug="bench", name="Bench")
    team = team_ensure(slug="bench-50", name="Bench, 50 policies")
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
    bare, fifty = _runs(bare_team, n), _runs(team, n)
    # Connections, caches, the first compile, the first signal through the channel layer.
    _interleaved(Clock(), bare[:20], fifty[:20], "warm")
    first = _stop_latency(team_ensure(slug="bench-warm", name="Bench warm"), 5, signals)
    CHECK_TIMES.clear()
    CHECK_CPU.clear()
    clock = Clock()
    _interleaved(clock, bare, fifty, "run")
    stops = _stop_latency(
        team_ensure(slug="bench-stop", name="Bench stop"), max(n // 4, 50), signals
    )
    checks = {
        (label, kind): (CHECK_TIMES[team_id, kind], CHECK_CPU[team_id, kind])
        for label, team_id in (("bare", bare_team.pk), ("fifty", team.pk))
        for kind in ("permit", "events")
    }
    rows = [
        latency_row(SECTION, "permit, no policy", clock.wall["permit bare"]),
        latency_row(SECTION, "permit, 50 enabled policies", clock.wall["permit fifty"]),
        latency_row(SECTION, "permit, CPU, no policy", clock.cpu["permit bare"]),
        latency_row(SECTION, "permit, CPU, 50 enabled policies", clock.cpu["permit fifty"]),
        latency_row(SECTION, "events batch (10 events), no policy", clock.wall["batch bare"]),
        latency_row(
            SECTION, "events batch (10 events), 50 enabled policies", clock.wall["batch fifty"]
        ),
        latency_row(SECTION, "events batch, CPU, no policy", clock.cpu["batch bare"]),
        latency_row(SECTION, "events batch, CPU, 50 enabled policies", clock.cpu["batch fifty"]),
        latency_row(
            SECTION,
            "permit: the policy checks inside it, no policy (the facts kept)",
            checks["bare", "permit"][0],
        ),
        latency_row(
            SECTION,
            "permit: the policy checks inside it, 50 enabled policies",
            checks["fifty", "permit"][0],
        ),
        latency_row(SECTION, "permit: CPU of the checks, no policy", checks["bare", "permit"][1]),
        latency_row(
            SECTION, "permit: CPU of the checks, 50 enabled policies", checks["fifty", "permit"][1]
        ),
        latency_row(
            SECTION,
            "events batch: the policy checks inside it, no policy",
            checks["bare", "events"][0],
        ),
        latency_row(
            SECTION,
            "events batch: the policy checks inside it, 50 enabled policies",
            checks["fifty", "events"][0],
        ),
        latency_row(
            SECTION, "events batch: CPU of the checks, no policy", checks["bare", "events"][1]
        ),
        latency_row(
            SECTION,
            "events batch: CPU of the checks, 50 enabled policies",
            checks["fifty", "events"][1],
        ),
        *(
            _added(
                f"{name}: {what} by 50 enabled policies (its checks', with − without)",
                checks["bare", kind][index],
                checks["fifty", kind][index],
                target_ms=1,
            )
            for kind, name in (("permit", "permit"), ("events", "events batch"))
            for index, what in enumerate(("added", "CPU added"))
        ),
        _added(
            "permit: whole, with − without", clock.wall["permit bare"], clock.wall["permit fifty"]
        ),
        _added(
            "permit: whole, CPU with − without", clock.cpu["permit bare"], clock.cpu["permit fifty"]
        ),
        _added(
            "events batch: whole, with − without",
            clock.wall["batch bare"],
            clock.wall["batch fifty"],
        ),
        _added(
            "events batch: whole, CPU with − without",
            clock.cpu["batch bare"],
            clock.cpu["batch fifty"],
        ),
        latency_row(
            SECTION,
            "policy stop: the breaking permit's commit → stop signal",
            stops["policy commit"],
            target_key="p99",
            target_ms=20,
        ),
        latency_row(
            SECTION, "policy stop: the breaking permit's start → stop signal", stops["policy"]
        ),
        latency_row(SECTION, "reviewer's stop: commit → stop signal", stops["reviewer commit"]),
        latency_row(SECTION, "reviewer's stop: run_stop's start → stop signal", stops["reviewer"]),
        latency_row(
            SECTION,
            "the process's first policy stop: the permit's start → stop signal",
            first["policy"][:1],
            note="its notice's link is the process's first reverse(): the URLconf is imported",
        ),
    ]
    for row in rows:
        row.command = COMMAND
    return rows


def _added(
    metric: str, bare: list[float], fifty: list[float], *, target_ms: float | None = None
) -> Row:
    """Percentile by percentile, what the team with 50 policies took more than the team with
    none (interleaved samples; a difference of two noisy figures, it can come out negative)."""
    figures = {
        key: round((percentile(fifty, q) or 0) - (percentile(bare, q) or 0), 3)
        for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
    }
    row = Row(SECTION, metric, {"count": len(fifty), **figures}, "ms")
    if target_ms is not None:
        row.target, row.judged = f"p99 ≤ {target_ms:g} ms", figures["p99"]
        row.met = figures["p99"] <= target_ms
    return row


if __name__ == "__main__":
    main()
