"""`make bench`: every benchmark against a real stack, then one table.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/run_all.py [--quick] [--only stop,ingest,usage,pages,approvals,bulk,idle,fanout,cost,ledger,mcp,scale] \\
        [--keep-db]

1. (re)creates a dedicated database (`BENCH_DB_NAME`, default `safestop_bench`) next to the
   one DATABASE_URL names, and migrates it; uses its own Redis database (`BENCH_REDIS_DB`,
   default 9) so its channel layer, Celery queue and rate-limit keys touch nobody else's;
2. starts daphne (`manage.py serve --no-demo`) on a free loopback port with REDIS_URL set, so
   channels-redis carries frames between processes; a Celery worker (with beat) where the
   production background work belongs in the picture (the end-to-end stop and the fan-out);
3. runs the benchmarks — each bounded in count and in time, loopback traffic only;
4. prints the table of every figure, then the figures that have a target against it (the table
   of docs/BENCHMARKS.md, with the command that makes each), writes
   `bench/results/latest.json`, stops what it started (by pid) and drops the database (unless
   --keep-db).

Figures only: nothing here passes or fails a build.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    PYTHON,
    ROOT,
    Row,
    drop_database,
    format_table,
    format_targets,
    free_port,
    machine,
    recreate_database,
    start,
    wait_for_port,
    with_database,
    with_redis_db,
)

SECTIONS = (
    "stop",
    "ingest",
    "usage",
    "pages",
    "approvals",
    "bulk",
    "idle",
    "fanout",
    "cost",
    "ledger",
    "mcp",
    "scale",
)
# A row's section → the `--only` that measures it (the fan-out also reports daphne's memory).
ONLY_FOR_SECTION = {"memory": "fanout"}


def _environment(args: argparse.Namespace) -> tuple[str, str, str, dict[str, str]]:
    admin_url = os.environ.get("DATABASE_URL", "")
    redis_url = os.environ.get("REDIS_URL", "")
    if not admin_url.startswith("postgres") or not redis_url.startswith("redis"):
        sys.exit(
            "bench needs DATABASE_URL=postgres://... and REDIS_URL=redis://... (see `make bench`)"
        )
    db_name = os.environ.get("BENCH_DB_NAME", "safestop_bench")
    bench_db_url = with_database(admin_url, db_name)
    bench_redis = with_redis_db(redis_url, int(os.environ.get("BENCH_REDIS_DB", "9")))
    env = {
        **os.environ,
        "DATABASE_URL": bench_db_url,
        "REDIS_URL": bench_redis,
        "DJANGO_SETTINGS_MODULE": "console.settings",
        "SAFESTOP_LOG_LEVEL": "WARNING",
        # The per-caller limit (6,000/min) exists to stop a runaway agent; the ingestion bench
        # *is* a runaway agent on purpose. Every request still pays for the Redis INCR.
        "SAFESTOP_RATE_LIMIT_PER_MINUTE": "100000000",
        "SAFESTOP_WEBHOOK_ALLOWED_HOSTS": "hooks.bench.test",
        "PYTHONUNBUFFERED": "1",
    }
    return admin_url, db_name, bench_db_url, env


def _setup_django(env: dict[str, str]) -> None:
    os.environ.update(
        {
            key: env[key]
            for key in (
                "DATABASE_URL",
                "REDIS_URL",
                "DJANGO_SETTINGS_MODULE",
                "SAFESTOP_LOG_LEVEL",
                "SAFESTOP_RATE_LIMIT_PER_MINUTE",
                "SAFESTOP_WEBHOOK_ALLOWED_HOSTS",
            )
        }
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)


def _principals() -> dict[str, object]:
    """A team, a staff user, a reviewer and an agent + reviewer token (the bench's own)."""
    from django.contrib.auth import get_user_model

    from runs.models import Membership, Role
    from runs.tokens import api_token_create, team_ensure

    team = team_ensure(slug="bench", name="Bench")
    users = get_user_model()
    staff_password = "bench-" + os.urandom(6).hex()
    users.objects.create_user(username="bench-admin", password=staff_password, is_staff=True)
    reviewer = users.objects.create_user(username="bench-reviewer", password=staff_password)
    Membership.objects.create(user=reviewer, team=team, role=Role.REVIEWER)
    _agent, agent_raw = api_token_create(team_slug=team.slug, name="bench-agent", role="agent")
    _reviewer, reviewer_raw = api_token_create(
        team_slug=team.slug, name="bench-reviewer", role="reviewer"
    )
    return {
        "team_id": team.pk,
        "team_slug": team.slug,
        "agent_token": agent_raw,
        "reviewer_token": reviewer_raw,
        "staff_username": "bench-admin",
        "staff_password": staff_password,
        "reviewer_username": "bench-reviewer",
    }


LOADS: dict[str, tuple[float, float]] = {}


def _run_section(name: str, fn: Callable[[], list[Row]]) -> tuple[list[Row], float]:
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    print(f"\n== {name} ... (load average {load_before:.2f})", flush=True)
    try:
        rows = fn()
    except Exception as error:  # one broken benchmark must not hide the others' figures
        traceback.print_exc()
        rows = [Row(name, "FAILED", {}, "", note=f"{type(error).__name__}: {error}"[:300])]
    elapsed = time.monotonic() - started
    LOADS[name] = (load_before, os.getloadavg()[0])
    for row in rows:
        print(format_table([row]).splitlines()[-1], flush=True)
    print(f"   ({elapsed:.1f} s)", flush=True)
    return rows, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="small counts: a smoke run of the harness"
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )
    parser.add_argument(
        "--keep-db", action="store_true", help="leave the bench database for inspection"
    )
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        sys.exit(f"unknown sections: {sorted(unknown)}")

    began = time.monotonic()
    admin_url, db_name, _bench_db_url, env = _environment(args)
    log_dir = ROOT / "bench" / "results" / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    # Two benches on one database would drop each other's: hold its lock for the whole run
    # (bench/bench_approvals.py alone uses a database of its own, so it may run beside).
    lock_name = ".lock" if db_name == "safestop_bench" else f".lock-{db_name}"
    lock = open(ROOT / "bench" / "results" / lock_name, "w")  # noqa: SIM115
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"another bench/run_all.py is running on {db_name} (bench/results/{lock_name})")
    print(f"bench database {db_name}, redis {env['REDIS_URL']}, logs in {log_dir}", flush=True)
    recreate_database(admin_url, db_name)
    daphne = None
    stack = None
    sections: dict[str, float] = {}
    rows: list[Row] = []
    try:
        _setup_django(env)
        principals = _principals()
        port = free_port()
        daphne = start(
            "daphne",
            [PYTHON, "manage.py", "serve", "--no-demo", "--host", "127.0.0.1", "--port", str(port)],
            env,
            log_dir,
        )
        wait_for_port(port, timeout=60, process=daphne.process)

        from bench.stack import Stack

        stack = Stack(
            base_url=f"http://127.0.0.1:{port}",
            port=port,
            env=env,
            log_dir=log_dir,
            daphne=daphne,
            quick=args.quick,
            **principals,
        )  # type: ignore[arg-type]
        # Order: what needs a quiet machine first; the Celery worker joins for the end-to-end parts.
        # BENCH_STOP_PARTS=end_to_end: only the end-to-end stop (its 100 stops, ~2 minutes).
        stop_parts = os.environ.get("BENCH_STOP_PARTS", "server,end_to_end").split(",")
        if "stop" in only and "server" in stop_parts:
            from bench import bench_stop

            section_rows, sections["stop: run_stop"] = _run_section(
                "stop (server time)", lambda: bench_stop.bench_run_stop_server_time(stack)
            )
            rows += section_rows
        if "ingest" in only:
            from bench import bench_ingest

            section_rows, sections["ingest"] = _run_section(
                "ingest", lambda: bench_ingest.run(stack)
            )
            rows += section_rows
        if "usage" in only:
            from bench import bench_usage

            section_rows, sections["usage"] = _run_section(
                "usage (the events path with usage events)", lambda: bench_usage.run(stack)
            )
            rows += section_rows
        if "pages" in only:
            from bench import bench_pages

            section_rows, sections["pages"] = _run_section("pages", lambda: bench_pages.run(stack))
            rows += section_rows
        if "approvals" in only:
            from bench import bench_approvals

            section_rows, sections["approvals"] = _run_section(
                "approvals", lambda: bench_approvals.run(stack)
            )
            rows += section_rows
        if "bulk" in only:
            from bench import bench_bulk_stop

            section_rows, sections["bulk"] = _run_section(
                "bulk stop (1,000 running runs)", lambda: bench_bulk_stop.run(stack)
            )
            rows += section_rows
        if "stop" in only or "fanout" in only or "idle" in only:
            stack.start_celery()
        if "idle" in only:
            # First with the worker: a quiet minute, before the live sections load it.
            from bench import bench_idle

            section_rows, sections["idle"] = _run_section(
                "idle (production shape, no runs)", lambda: bench_idle.run(stack)
            )
            rows += section_rows
        if "stop" in only and "end_to_end" in stop_parts:
            from bench import bench_stop

            section_rows, sections["stop: end to end"] = _run_section(
                "stop (end to end, Celery worker running)",
                lambda: bench_stop.bench_stop_end_to_end(stack),
            )
            rows += section_rows
        if "fanout" in only:
            from bench import bench_fanout

            section_rows, sections["fanout"] = _run_section(
                "fanout", lambda: bench_fanout.run(stack)
            )
            rows += section_rows
            # the same 200 viewers at a lighter pace: where the current fan-out still keeps up
            section_rows, sections["fanout 10/s"] = _run_section(
                "fanout (10 changes/s)",
                lambda: bench_fanout.run(stack, rate=10.0, seconds=stack.n(15.0, 4.0)),
            )
            rows += [row for row in section_rows if row.section == "fanout"]
        if "cost" in only:
            # CPU per operation by process kind, on a Redis, daphne and Celery of its own
            # (bench/bench_cost.py): the figures docs/OPERATIONS.md sizes a deployment with.
            from bench import bench_cost

            section_rows, sections["cost"] = _run_section(
                "cost (CPU per operation, by process kind)", lambda: bench_cost.run(stack)
            )
            rows += section_rows
        if "ledger" in only:
            # After the live sections: its entries would lengthen the scheduled verification.
            from bench import bench_ledger

            section_rows, sections["ledger"] = _run_section(
                "ledger verification", lambda: bench_ledger.run(stack)
            )
            rows += section_rows
        if "mcp" in only:
            from bench import bench_mcp

            section_rows, sections["mcp"] = _run_section(
                "mcp gateway (server-everything echo)", lambda: bench_mcp.run(stack)
            )
            rows += section_rows
        if "scale" in only:
            # Last: it starts four daphne processes and nginx of its own (bench/bench_scale.py).
            from bench import bench_scale

            section_rows, sections["scale"] = _run_section(
                "scale (1, 2, 4 daphne behind nginx)", lambda: bench_scale.run(stack)
            )
            rows += section_rows
    finally:
        if stack is not None:
            stack.stop_celery()
        if daphne is not None:
            daphne.stop()
        if not args.keep_db:
            from django.db import connections

            connections.close_all()
            drop_database(admin_url, db_name)

    total = time.monotonic() - began
    for row in rows:
        row.command = row.command or (
            f"bench/run_all.py --only {ONLY_FOR_SECTION.get(row.section, row.section)}"
            + (" --quick" if args.quick else "")
        )
    table = format_table(rows)
    targets = format_targets(rows)
    info = machine()
    print("\n" + table)
    print(
        f"\nmachine: {info['nproc']} cores, {info['cpu']}; {info['python']}; {info['postgres']}; {info['redis']}"
    )
    print(
        "sections: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sections.items())
        + f"; total {total:.0f} s"
    )
    print(
        "1-min load average before → after each section (2 cores; other work on the machine shows here): "
        + ", ".join(f"{name} {before:.1f}→{after:.1f}" for name, (before, after) in LOADS.items())
    )
    for row in rows:
        if row.note:
            print(f"  - {row.section} / {row.metric.strip()}: {row.note}")
    print("\nFigures against their targets (docs/BENCHMARKS.md keeps the latest of this table):\n")
    print(targets)
    # A subset (`--only`, bench/bench_approvals.py) does not overwrite the whole run's figures.
    name = "quick" if args.quick else "latest"
    if set(only) != set(SECTIONS):
        name += "-" + "-".join(only)
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.write_text(
        json.dumps(
            {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": " ".join(["bench/run_all.py", *sys.argv[1:]]),
                "machine": info,
                "total_seconds": round(total, 1),
                "sections_seconds": sections,
                "load_average": {
                    name: {"before": before, "after": after}
                    for name, (before, after) in LOADS.items()
                },
                "rows": [row.as_dict() for row in rows],
                "table": table,
                "targets": targets,
            },
            indent=2,
            default=str,
        )
    )
    print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
