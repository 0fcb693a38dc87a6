"""Bulk stop (DESIGN §12): 1,000 running runs, each with a live lease, stopped at once.

In `run_all.py` (section `bulk`), or standalone with a test database of its own:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/bench_bulk_stop.py

Times `services.bulk_stop` — the very service the API (`POST /api/v1/runs/stop/`) and the
console call — from the call to its return, which is after the last of its 1,000 commits (each
run stopped by `run_stop` in its own transaction: StopRequest, epoch bump, outbox freeze, ledger
entry with the bulk_id, and the on-commit publish), plus the BulkStop and its results. Every run
has a live lease, so no stop settles in its own transaction: the workers are told and the runs
wait in `cancel_requested`, as in an incident. Also checks the outcome (1,000 stop requests, every
run `cancel_requested`). The 1-minute load average is printed with the figure: the machine has 2
cores shared with other work. Target: all commits in under 5 s. Figures only.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Row, format_table  # noqa: E402

RUNS = int(os.environ.get("BENCH_BULK_RUNS", 1000))
# Unset: the service's default (SAFESTOP_BULK_STOP_WORKERS, 16).
WORKERS = os.environ.get("BENCH_BULK_WORKERS", "")
TARGET_S = 5.0


def _running_runs(team: Any, count: int, *, prefix: str) -> list[tuple[str, Any]]:
    """`count` running runs of one agent, each with a live lease, through the services."""
    from runs import services
    from runs.actors import Actor

    agent = Actor("api_client", "1", "bench-agent")
    made = []
    for index in range(count):
        run = services.run_create(
            team=team, title=f"Refund ticket #{index}", agent=f"{prefix}-agent", actor=agent
        )
        lease = services.lease_acquire(
            run_id=run.pk, worker_id=f"worker-{index}", ttl_seconds=3600, actor=agent
        )
        made.append((run.pk, lease))
    return made


def bench_bulk_stop(team: Any, *, runs: int = RUNS, quick: bool = False) -> list[Row]:
    from django.conf import settings

    from runs import services
    from runs.actors import Actor
    from runs.models import BulkStop, Run, RunStatus, StopRequest

    count = 50 if quick else runs
    if WORKERS:
        settings.SAFESTOP_BULK_STOP_WORKERS = int(WORKERS)
    workers = services.bulk_stop_workers()
    prefix = f"bulk-{int(time.time())}"
    started = time.perf_counter()
    made = _running_runs(team, count, prefix=prefix)
    setup_s = time.perf_counter() - started
    load_before = os.getloadavg()[0]
    cpu_started = time.process_time()
    started = time.perf_counter()
    answer = services.bulk_stop(
        actor=Actor("user", "0", "bench-reviewer"),
        team_ids=[team.pk],
        filter=services.BulkFilter(agent=f"{prefix}-agent", status=RunStatus.RUNNING),
        reason="user_stop",
        note="bench: an agent gone wrong",
        idempotency_key=prefix,
    )
    elapsed_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    load_after = os.getloadavg()[0]
    run_ids = [run_id for run_id, _ in made]
    stopped = StopRequest.objects.filter(run_id__in=run_ids).count()
    cancel_requested = Run.objects.filter(pk__in=run_ids, status=RunStatus.CANCEL_REQUESTED).count()
    assert answer.bulk.counts == {"stopped": count}, answer.bulk.counts
    assert stopped == cancel_requested == count, (stopped, cancel_requested)
    assert BulkStop.objects.filter(bulk_id=answer.bulk.bulk_id).exists()
    # Settled afterwards (not timed), so no drain watchdog fences a thousand stops later on.
    for run_id, lease in made:
        services.run_drained(
            run_id=run_id, lease_token=lease.token, epoch=lease.epoch, actor=Actor.system("bench")
        )
    per_run_ms = elapsed_s * 1000 / count
    note = (
        f"{count:,} runs, each its own transaction, {workers} at a time; "
        f"{per_run_ms:.2f} ms per run; this process's CPU {cpu_s:.2f} s; "
        f"1-min load average {load_before:.2f} → {load_after:.2f}; setup {setup_s:.0f} s"
    )
    print(
        f"bulk stop of {count:,} running runs (live leases): {elapsed_s:.2f} s "
        f"({per_run_ms:.2f} ms per run, {workers} at a time, CPU {cpu_s:.2f} s), "
        f"load average {load_before:.2f} → {load_after:.2f}",
        flush=True,
    )
    return [
        Row(
            "bulk",
            f"bulk_stop of {count:,} running runs, all commits",
            {
                "value": round(elapsed_s, 2),
                "count": count,
                "per_run_ms": round(per_run_ms, 2),
                "cpu_seconds": round(cpu_s, 2),
                "workers": workers,
                "load_before": round(load_before, 2),
                "load_after": round(load_after, 2),
            },
            "s",
            f"≤ {TARGET_S:g} s" if not quick else "",
            elapsed_s,
            (elapsed_s <= TARGET_S) if not quick else None,
            note,
        )
    ]


def run(stack: Any) -> list[Row]:
    """The `bulk` section of run_all.py: a team of its own, so no other bench sees these runs."""
    from runs.tokens import team_ensure

    team = team_ensure(slug="bench-bulk", name="Bench bulk stop")
    return bench_bulk_stop(team, quick=stack.quick)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("SAFESTOP_TEST_DB_NAME", "test_safestop_bench_bulk")
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
        team = team_ensure(slug="bench-bulk", name="Bench bulk stop")
        rows = bench_bulk_stop(team)
        print(format_table(rows))
        for row in rows:
            print(f"  - {row.note}")
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
