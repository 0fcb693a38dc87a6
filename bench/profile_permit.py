"""What one tool call costs the database: the statements of one `permit_request` and of one
`tool_result_report` (what the MCP gateway asks for every `tools/call`), and their wall time
over many calls of one run, one after another, in-process (no HTTP, no gateway).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/profile_permit.py
    #   PROFILE_PERMIT_CALLS=300
    #   PROFILE_PERMIT_CPROFILE=1 also prints where a permit's and a result's CPU goes
    #   PROFILE_PERMIT_SORT=tottime orders that profile by own time (default: cumulative)

Runs on a test database of its own (SAFESTOP_TEST_DB_NAME, default
`test_safestop_profile_permit`). Prints the p50 and p95 wall time of each, with the 1-minute load
average: on a shared machine the waits on PostgreSQL are most of it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CALLS = int(os.environ.get("PROFILE_PERMIT_CALLS", 300))
CPROFILE = os.environ.get("PROFILE_PERMIT_CPROFILE") == "1"


def _statements(what: str, call: Callable[[], Any]) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        call()
    print(f"one {what}: {len(queries.captured_queries)} statements")
    for query in queries.captured_queries:
        print(f"  {query['sql'][:140]}")


def _timed(calls: list[Callable[[], Any]]) -> str:
    samples = []
    cpu = []
    for call in calls:
        started, cpu_started = time.perf_counter(), time.thread_time()
        call()
        samples.append((time.perf_counter() - started) * 1000)
        cpu.append((time.thread_time() - cpu_started) * 1000)
    samples.sort()
    cpu.sort()
    return (
        f"p50 {samples[len(samples) // 2]:.2f} ms, p95 {samples[int(len(samples) * 0.95)]:.2f} ms"
        f" (this process's CPU p50 {cpu[len(cpu) // 2]:.2f} ms)"
    )


def profile(team: Any) -> None:
    from runs import services
    from runs.actors import Actor

    agent = Actor("api_client", "1", "profile-agent")
    run = services.run_create(team=team, title="Echo", agent="profile-agent", actor=agent)
    lease = services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=3600, actor=agent)

    def permit(index: int) -> None:
        services.permit_request(
            run_id=run.pk,
            epoch=lease.epoch,
            tool_call_id=f"mcp:profile:{index}",
            tool="echo",
            actor=agent,
            side_effect="write",
            arguments={"message": f"m{index}"},
            summary="MCP everything: echo",
        )

    def report(index: int) -> None:
        services.tool_result_report(
            run_id=run.pk,
            tool_call_id=f"mcp:profile:{index}",
            execution_state="succeeded",
            actor=agent,
            observation=f"Echo: m{index}",
            source="mcp-gateway",
        )

    _statements("permit_request", lambda: permit(-1))
    _statements("tool_result_report", lambda: report(-1))
    load = os.getloadavg()[0]
    permits = _timed([lambda i=i: permit(i) for i in range(CALLS)])
    reports = _timed([lambda i=i: report(i) for i in range(CALLS)])
    print(f"{CALLS} permit_request: {permits}")
    print(f"{CALLS} tool_result_report: {reports}")
    print(f"load average {load:.2f} → {os.getloadavg()[0]:.2f}")
    if CPROFILE:
        _cpu_profile("permit_request", [lambda i=i: permit(i) for i in range(CALLS, 2 * CALLS)])
        _cpu_profile("tool_result_report", [lambda i=i: report(i) for i in range(CALLS, 2 * CALLS)])


def _cpu_profile(what: str, calls: list[Callable[[], Any]]) -> None:
    """Where the CPU goes, on a CPU clock: waits on PostgreSQL do not count."""
    import cProfile
    import pstats

    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    for call in calls:
        call()
    profiler.disable()
    print(f"--- {what}, {len(calls)} calls, CPU")
    pstats.Stats(profiler).sort_stats(
        os.environ.get("PROFILE_PERMIT_SORT", "cumulative")
    ).print_stats(45)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("SAFESTOP_TEST_DB_NAME", "test_safestop_profile_permit")
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
        profile(team_ensure(slug="profile-permit", name="Profile permit"))
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
