"""Ledger verification of 1,000,000 entries: time, progress, peak memory.

1. COPYs a valid hash-chained ledger (bench/fixtures.py `ledger_chain_rows`): runs of 50
   entries each, plus a global chain of 100, first `--small` entries, then up to `--entries`;
2. after each, runs `ledger_verify` in a fresh child process (this file, `verify` mode), which
   prints its progress lines as JSON and, at the end, its peak RSS (VmHWM) before and after
   the walk: if the walk streams, the peak is the same for 100,000 entries as for 1,000,000;
3. changes one entry behind the append-only trigger's back (the superuser's way) at position
   k (80 % of the way) and checks the walk names that very entry.

Standalone (its own database, kept for the next run unless --fresh):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/13 \\
        .venv/bin/python bench/bench_ledger.py [--small 100000] [--entries 1000000] [--fresh]

`bench/run_all.py --only ledger` runs the same on the bench database with modest counts
(20,000 then 100,000; BENCH_LEDGER_FULL=1 for 100,000 then 1,000,000).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import PYTHON, ROOT, Row, emit, format_table, rate_row  # noqa: E402

PER_RUN = 50
GLOBAL_ENTRIES = 100
PROGRESS_EVERY = 100_000


def _vm_kib(key: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name == key:
                return int(rest.split()[0])
    return 0


def _verify_child() -> None:
    """`verify` mode: walk the ledger once, report progress and memory as JSON lines."""
    import django

    django.setup()
    from runs.ledger import VerifyProgress, ledger_verify

    before = _vm_kib("VmHWM")

    def progress(report: VerifyProgress) -> None:
        emit(
            {
                "progress": report.checked,
                "seconds": report.seconds,
                "rate": report.rate,
                "rss_kib": _vm_kib("VmRSS"),
            }
        )

    started = time.perf_counter()
    checked, broken = ledger_verify(progress=progress, progress_every=PROGRESS_EVERY)
    emit(
        {
            "checked": checked,
            "seconds": time.perf_counter() - started,
            "broken": None if broken is None else broken.entry_id,
            "problem": "" if broken is None else broken.problem,
            "hwm_before_kib": before,
            "hwm_after_kib": _vm_kib("VmHWM"),
        }
    )


def verify_in_child(env: dict[str, str]) -> dict[str, Any]:
    answer = subprocess.run(
        [PYTHON, str(Path(__file__).resolve()), "verify"],
        cwd=str(ROOT),
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(line) for line in answer.stdout.splitlines() if line.startswith("{")]
    result = lines[-1]
    result["progress_lines"] = [line for line in lines if "progress" in line]
    return result


def ledger_size() -> int:
    from runs.models import LedgerEntry

    return LedgerEntry.objects.count()


def grow_ledger(team_slug: str, team_id: int, target: int) -> float:
    """COPY runs and their chains until the ledger holds `target` entries; seconds taken."""
    from django.db import transaction

    from bench.fixtures import analyze, copy_rows, ledger_chain_rows
    from runs.models import LedgerEntry, Run

    started = time.perf_counter()
    have = ledger_size()
    runs = max(0, (target - have - (0 if have else GLOBAL_ENTRIES)) // PER_RUN)
    prefix = _unused_prefix()
    run_ids = [row["id"] for row in _new_runs(runs, team_id, prefix)]
    with transaction.atomic():
        copy_rows(Run, _new_runs(runs, team_id, prefix))
        chains: list[str | None] = list(run_ids)
        if not have:
            copy_rows(
                LedgerEntry,
                ledger_chain_rows([None], per_run=GLOBAL_ENTRIES, team_slug=""),
            )
        copy_rows(LedgerEntry, ledger_chain_rows(chains, per_run=PER_RUN, team_slug=team_slug))
    analyze(Run._meta.db_table, LedgerEntry._meta.db_table, vacuum=True)
    return time.perf_counter() - started


def _unused_prefix() -> str:
    """`run_` + a letter no run id has yet: `run_rows` keeps 16 characters, so the prefix has
    five and every growth step its own letter."""
    from runs.models import Run

    for letter in "lmnopqrstuvwxyz":
        if not Run.objects.filter(pk__startswith=f"run_{letter}").exists():
            return f"run_{letter}"
    raise RuntimeError("no run id prefix left: use --fresh")


def _new_runs(count: int, team_id: int, prefix: str) -> Iterable[dict[str, Any]]:
    """The runs the chains belong to; the prefix names the growth step, so ids stay unique."""
    from bench.fixtures import run_rows

    return run_rows(count, team_ids=[team_id], id_prefix=prefix)


def tamper(position: int) -> int:
    """Change the entry at walk position `position` (0-based) as a superuser could; its id."""
    from django.db import connection

    from runs.models import LedgerEntry

    entry_id = (
        LedgerEntry.objects.order_by("run_id", "run_seq")
        .values_list("pk", flat=True)[position : position + 1]
        .get()
    )
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE runs_ledgerentry SET reason = 'forged' WHERE id = %s", [entry_id])
        cursor.execute("SET session_replication_role = DEFAULT")
    return entry_id


def untamper(entry_id: int) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute("UPDATE runs_ledgerentry SET reason = '' WHERE id = %s", [entry_id])
        cursor.execute("SET session_replication_role = DEFAULT")


def measure(
    env: dict[str, str], team_slug: str, team_id: int, sizes: list[int], *, tamper_check: bool
) -> list[Row]:
    rows: list[Row] = []
    for size in sizes:
        build = grow_ledger(team_slug, team_id, size) if ledger_size() < size else 0.0
        load = os.getloadavg()[0]
        result = verify_in_child(env)
        assert result["broken"] is None, result
        rss = [line["rss_kib"] for line in result["progress_lines"]]
        rows.append(
            rate_row(
                "ledger",
                f"verify {result['checked']:,} entries",
                result["checked"] / result["seconds"],
                "entries/s",
                extra={
                    "seconds": result["seconds"],
                    "peak_rss_mib": result["hwm_after_kib"] / 1024,
                    "peak_before_walk_mib": result["hwm_before_kib"] / 1024,
                },
                note=f"{result['seconds']:.1f} s; peak RSS {result['hwm_after_kib'] / 1024:.0f} MiB "
                f"({result['hwm_before_kib'] / 1024:.0f} MiB before the walk; RSS at the progress "
                f"lines {', '.join(f'{kib / 1024:.0f}' for kib in rss) or '-'} MiB); "
                f"{len(result['progress_lines'])} progress lines; fixture COPY {build:.0f} s; "
                f"load {load:.1f}",
            )
        )
    if tamper_check:
        total = ledger_size()
        k = total * 4 // 5
        entry_id = tamper(k)
        try:
            result = verify_in_child(env)
        finally:
            untamper(entry_id)
        found = result["broken"] == entry_id and result["checked"] == k + 1
        rows.append(
            Row(
                "ledger",
                f"tampered entry at position {k:,} of {total:,}",
                {"value": result["seconds"]},
                "s",
                "found",
                None,
                found,
                note=f"named entry {result['broken']} ({result['problem']}) after "
                f"{result['checked']:,} entries in {result['seconds']:.1f} s; changed was {entry_id}",
            )
        )
    return rows


def run(stack: Any) -> list[Row]:
    """The run_all section: modest counts unless BENCH_LEDGER_FULL=1."""
    full = os.environ.get("BENCH_LEDGER_FULL") == "1"
    sizes = [100_000, 1_000_000] if full else [stack.n(100_000, 20_000)]
    if not full:
        sizes = [stack.n(20_000, 5_000), *sizes]
    return measure(stack.env, stack.team_slug, stack.team_id, sizes, tamper_check=True)


def _database_exists(admin_url: str, name: str) -> bool:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return found is not None


def main(argv: list[str]) -> None:
    if argv[:1] == ["verify"]:
        _verify_child()
        return
    parser = argparse.ArgumentParser(description="Ledger verification at a million entries.")
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--fresh", action="store_true", help="drop the kept database first")
    args = parser.parse_args(argv)
    os.environ.setdefault("BENCH_DB_NAME", "safestop_bench_ledger")
    os.environ.setdefault("BENCH_REDIS_DB", "13")
    from bench.common import recreate_database
    from bench.run_all import _environment, _setup_django

    admin_url, db_name, _url, env = _environment(args)
    if args.fresh or not _database_exists(admin_url, db_name):
        recreate_database(admin_url, db_name)
    _setup_django(env)
    from runs.tokens import team_ensure

    team = team_ensure(slug="bench", name="Bench")
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    rows = measure(env, team.slug, team.pk, [args.small, args.entries], tamper_check=True)
    print(format_table(rows))
    for row in rows:
        print(f"  - {row.metric}: {row.note}")
    print(f"load average after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
