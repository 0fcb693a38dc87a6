"""Where one `POST /api/v1/runs/{id}/events/` spends its time, in-process (no HTTP, no daphne).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/profile_ingest.py [--requests 400] [--batch 1] [--top 40]

Builds its own database (`BENCH_DB_NAME`, default `safestop_profile`) and Redis database
(`BENCH_REDIS_DB`, default 11), a team, an agent token and a leased run, then sends single
events (started / completed in turn, as bench/bench_ingest.py does) through Django's test
client — the whole middleware chain, DRF, the service and the commit with its on-commit
publish, and, as under daphne, the connection back to the pool after each request and
checked on its way out for the next — under cProfile, and prints the functions by cumulative
time (`--sort tottime`, or both with `--sort both`) and the mean time per request. Before that, the same requests without
the profiler give this process's CPU time per request (`time.process_time`: the machine is
shared, and CPU time is what the load weighs on least; PostgreSQL's and Redis' CPU is not in
it). Figures only, for finding the hot path; the rates are bench_ingest.py's.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import drop_database, recreate_database, with_database, with_redis_db  # noqa: E402


def _setup(admin_url: str, db_name: str) -> None:
    recreate_database(admin_url, db_name)
    os.environ.update(
        {
            "DATABASE_URL": with_database(admin_url, db_name),
            "REDIS_URL": with_redis_db(
                os.environ["REDIS_URL"], int(os.environ.get("BENCH_REDIS_DB", "11"))
            ),
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "SAFESTOP_LOG_LEVEL": "WARNING",
            "SAFESTOP_RATE_LIMIT_PER_MINUTE": "100000000",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _leased_run() -> tuple[str, int, str]:
    from runs import services
    from runs.actors import Actor
    from runs.tokens import api_token_create, team_ensure

    team = team_ensure(slug="profile")
    _token, raw = api_token_create(team_slug=team.slug, name="profile-agent", role="agent")
    system = Actor.system("profile")
    run = services.run_create(team=team, title="Profile", agent="profile", actor=system)
    lease = services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=3600, actor=system)
    return run.pk, lease.epoch, raw


def _send(
    client: object, run_id: str, epoch: int, raw: str, start: int, count: int, batch: int
) -> None:
    from django.db import close_old_connections

    from bench.bench_ingest import batch_events, single_event

    for number in range(start, start + count):
        events = batch_events(0, number) if batch > 1 else [single_event(0, number)]
        response = client.post(  # type: ignore[attr-defined]
            f"/api/v1/runs/{run_id}/events/",
            data=json.dumps({"epoch": epoch, "events": events}),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {raw}",
        )
        if response.status_code != 200 or response.json()["rejected"]:
            raise RuntimeError(f"{response.status_code}: {response.content[:300]!r}")
        # What daphne does at the end of every request (the test client does not): the
        # connection goes back to the pool, and the next request takes one out, checked.
        close_old_connections()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--batch", type=int, default=1, help="1 (single events) or 100")
    parser.add_argument("--top", type=int, default=40, help="0: no profile, the CPU figure only")
    parser.add_argument("--sort", default="cumulative", help="a pstats key, or `both`")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: profile this thread's CPU time (time.thread_time), so waits on PostgreSQL, "
        "Redis and the publisher's loop count for nothing",
    )
    parser.add_argument("--save", help="also write the pstats data to this file")
    args = parser.parse_args()
    admin_url = os.environ["DATABASE_URL"]
    db_name = os.environ.get("BENCH_DB_NAME", "safestop_profile")
    _setup(admin_url, db_name)
    try:
        from django.test import Client

        run_id, epoch, raw = _leased_run()
        client = Client()
        warm = 40
        _send(client, run_id, epoch, raw, 0, warm, args.batch)
        cpu_started, wall_started = time.process_time(), time.perf_counter()
        _send(client, run_id, epoch, raw, warm, args.requests, args.batch)
        cpu = (time.process_time() - cpu_started) / args.requests * 1000
        wall = (time.perf_counter() - wall_started) / args.requests * 1000
        if args.top <= 0:  # the CPU figure alone
            print(
                f"{args.requests} requests of {args.batch} event(s): {cpu:.2f} ms CPU per request "
                f"in this process ({wall:.2f} ms wall); load average {os.getloadavg()[0]:.2f}"
            )
            return
        profiler = cProfile.Profile(time.thread_time) if args.clock == "cpu" else cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        _send(client, run_id, epoch, raw, warm + args.requests, args.requests, args.batch)
        profiler.disable()
        elapsed = time.perf_counter() - started
        if args.save:
            profiler.dump_stats(args.save)
        for key in ("cumulative", "tottime") if args.sort == "both" else (args.sort,):
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(args.top)
            print(out.getvalue())
        print(
            f"{args.requests} requests of {args.batch} event(s): "
            f"{cpu:.2f} ms CPU per request in this process without the profiler "
            f"({wall:.2f} ms wall), {elapsed / args.requests * 1000:.2f} ms per request under "
            f"cProfile; load average {os.getloadavg()[0]:.2f}"
        )
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(admin_url, db_name)


if __name__ == "__main__":
    main()
