"""Where one `run_stop` (or, with PROFILE_STOP_PHASE=drained, one `run_drained`: the worker's
drained answer, which settles the run and builds its stop packet) spends its time: the statements
it sends and a cProfile of many of them.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/profile_stop.py
    #   PROFILE_STOP_RUNS=300  PROFILE_STOP_OUT=/tmp/stop.prof  PROFILE_STOP_TOP=40
    #   PROFILE_STOP_PHASE=drained

Runs on a test database of its own (SAFESTOP_TEST_DB_NAME, default `test_safestop_profile_stop`).
Makes running runs with live leases (as `bench_bulk_stop.py` does), prints the SQL of one stop,
then stops half of the rest one after another for the CPU time (and wall time) per stop, and the
other half under cProfile (CPU time), printing the functions that cost the most cumulative CPU
time; each with the 1-minute load average.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RUNS = int(os.environ.get("PROFILE_STOP_RUNS", 300))
OUT = os.environ.get("PROFILE_STOP_OUT", "")
TOP = int(os.environ.get("PROFILE_STOP_TOP", 40))
PHASE = os.environ.get("PROFILE_STOP_PHASE", "stop")


def _running_runs(team: Any, count: int) -> list[tuple[str, Any]]:
    from runs import services
    from runs.actors import Actor

    agent = Actor("api_client", "1", "profile-agent")
    made = []
    for index in range(count):
        run = services.run_create(
            team=team, title=f"Refund ticket #{index}", agent="profile-agent", actor=agent
        )
        lease = services.lease_acquire(
            run_id=run.pk, worker_id=f"worker-{index}", ttl_seconds=3600, actor=agent
        )
        made.append((run.pk, lease))
    return made


def _stop(run_id: str, actor: Any) -> None:
    from runs import services

    services.run_stop(run_id=run_id, reason="user_stop", actor=actor, bulk_id="bulk_profile")


def _drained(run_id: str, lease: Any) -> None:
    from runs import services
    from runs.actors import Actor

    services.run_drained(
        run_id=run_id,
        lease_token=lease.token,
        epoch=lease.epoch,
        actor=Actor("api_client", "1", "profile-agent"),
    )


def _print_statements_of_one(transition: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        transition()
    print(f"one run_{PHASE}: {len(queries.captured_queries)} statements")
    for query in queries.captured_queries:
        print(f"  {query['sql'][:160]}")


def profile(team: Any) -> None:
    from runs.actors import Actor

    actor = Actor("user", "0", "profile-reviewer")
    made = _running_runs(team, RUNS + 1)
    if PHASE == "drained":
        for run_id, _lease in made:
            _stop(run_id, actor)
        transitions = [lambda r=run_id, le=lease: _drained(r, le) for run_id, lease in made]
    else:
        transitions = [lambda r=run_id: _stop(r, actor) for run_id, _lease in made]
    _print_statements_of_one(transitions[0])
    # CPU time, not wall time: on a shared machine the waits on PostgreSQL would swamp the
    # Python, and the Python is what one interpreter's threads cannot overlap. Half of them
    # without the profiler (what a transition costs), the other half under it (where it goes).
    plain, profiled = transitions[1 : 1 + RUNS // 2], transitions[1 + RUNS // 2 :]
    load_before = os.getloadavg()[0]
    cpu_started, started = time.process_time(), time.perf_counter()
    for transition in plain:
        transition()
    wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    print(
        f"{len(plain)} run_{PHASE} one after another: {wall_s * 1000 / len(plain):.2f} ms wall, "
        f"{cpu_s * 1000 / len(plain):.2f} ms CPU each; "
        f"load average {load_before:.2f} → {os.getloadavg()[0]:.2f}"
    )
    profiler = cProfile.Profile(time.process_time)
    load_before = os.getloadavg()[0]
    cpu_started, started = time.process_time(), time.perf_counter()
    profiler.enable()
    for transition in profiled:
        transition()
    profiler.disable()
    wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    print(
        f"{len(profiled)} run_{PHASE} one after another under cProfile: wall {wall_s:.2f} s, "
        f"CPU {cpu_s:.2f} s ({cpu_s * 1000 / len(profiled):.2f} ms CPU each, profiler overhead "
        f"included); load average {load_before:.2f} → {os.getloadavg()[0]:.2f}"
    )
    if OUT:
        profiler.dump_stats(OUT)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(TOP)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("SAFESTOP_TEST_DB_NAME", "test_safestop_profile_stop")
    os.environ.setdefault("SAFESTOP_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_test_environment

    from runs.tokens import team_ensure

    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        profile(team_ensure(slug="profile-stop", name="Profile stop"))
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
