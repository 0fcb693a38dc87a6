"""Idle: what the production shape spends doing nothing, and what waking on events costs.

1. Idle CPU — daphne, the Celery worker (with its embedded beat), the PostgreSQL backends of the
   bench database and the Redis server, over `seconds` with no run at all: CPU time (user +
   system, from /proc/<pid>/stat, what psutil's `cpu_times` reads) of each process tree, as a
   share of one core. Redis and the PostgreSQL server's own background processes serve every
   engineer on this machine: Redis is reported, not judged; only our database's backends count.
2. Enqueue → dispatch — an outbox item enqueued in this process, timed from its insert to its
   claim (`claimed_at - created_at`, both the server's clock). The kick on commit wakes this
   process's own dispatcher thread (`runs.local_dispatch`), as it does in a web process; the
   Celery worker gets what that thread leaves. The row says who claimed how many. The items go
   to `hooks.bench.test`, which does not resolve: the claim is what is timed, and the claimer
   records `failed` at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.common import Row, latency_row
from bench.stack import Stack

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of one process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _tree(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                parents[int(entry.name)] = stat[0]
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return tree


def _cpu(pids: set[int]) -> float:
    return sum(stat[1] for pid in pids if (stat := _stat(pid)) is not None)


def _redis_pids() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "redis-server":
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def _postgres_backends() -> set[int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        return {pid for (pid,) in cursor.fetchall()}


def _settle(pid: int, *, quiet_pct: float = 2.0, longest: float = 90.0) -> None:
    """Wait until the worker has started and finished what earlier sections queued (its CPU
    below `quiet_pct` of a core for three seconds running), so the minute measured is idle."""
    deadline = time.monotonic() + longest
    quiet = 0
    while time.monotonic() < deadline and quiet < 3:
        pids = _tree(pid)
        before = _cpu(pids)
        time.sleep(1.0)
        quiet = quiet + 1 if 100 * (_cpu(pids) - before) < quiet_pct else 0


def idle_cpu(stack: Stack, *, seconds: float) -> list[Row]:
    from django.db import connection

    assert stack.celery is not None, "the Celery worker must be running"
    connection.close()  # our own backend is not part of the shape
    _settle(stack.celery.pid)
    kinds: dict[str, set[int]] = {
        "daphne": _tree(stack.daphne.pid),
        "celery worker + beat": _tree(stack.celery.pid),
        "postgresql backends (bench db)": _postgres_backends(),
        "redis-server (shared)": _redis_pids(),
    }
    connection.close()
    before = {kind: _cpu(pids) for kind, pids in kinds.items()}
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    spent = {kind: _cpu(pids) - before[kind] for kind, pids in kinds.items()}
    rows = [
        Row(
            "idle",
            f"  {kind}: CPU over {elapsed:.0f} s idle",
            {"cpu_s": round(cpu, 3), "core_pct": round(100 * cpu / elapsed, 3)},
            "% of a core",
        )
        for kind, cpu in spent.items()
    ]
    ours = sum(cpu for kind, cpu in spent.items() if "shared" not in kind)
    share = 100 * ours / elapsed
    rows.insert(
        0,
        Row(
            "idle",
            "idle production shape: CPU of daphne + Celery worker/beat + PostgreSQL backends",
            {"cpu_s": round(ours, 3), "core_pct": round(share, 3), "seconds": round(elapsed, 1)},
            "% of a core",
            target="≤ 1 % of a core",
            judged=round(share, 3),
            met=share <= 1.0,
            note="Redis serves every engineer on this machine: listed, not judged",
        ),
    )
    return rows


def enqueue_to_dispatch(stack: Stack, *, items: int) -> list[Row]:
    from runs import services
    from runs.actors import Actor
    from runs.models import OutboxItem, Team

    system = Actor.system("bench")
    team = Team.objects.get(pk=stack.team_id)
    run = services.run_create(
        team=team, title="Idle-then-enqueue", agent="idle-agent", actor=system
    )
    lease = services.lease_acquire(
        run_id=run.pk, worker_id="idle-worker", ttl_seconds=600, actor=system
    )
    ids = []
    for n in range(items):
        item, _ = services.outbox_enqueue(
            run_id=run.pk,
            epoch=lease.epoch,
            transport="webhook",
            destination="https://hooks.bench.test/idle",
            payload={"n": n},
            idempotency_key=f"idle-{n}",
            actor=system,
        )
        ids.append(item.pk)
        time.sleep(0.25)  # one at a time, from an idle dispatcher
    deadline = time.monotonic() + 30
    claimed: list[Any] = []
    while time.monotonic() < deadline:
        claimed = list(
            OutboxItem.objects.filter(pk__in=ids, claimed_at__isnull=False).values_list(
                "created_at", "claimed_at"
            )
        )
        if len(claimed) == len(ids):
            break
        time.sleep(0.2)
    samples = [(claimed_at - created).total_seconds() * 1000 for created, claimed_at in claimed]
    here = OutboxItem.objects.filter(pk__in=ids, claimed_by__contains=f":{os.getpid()}:").count()
    services.run_stop(run_id=run.pk, reason="user_stop", actor=system)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=system)
    return [
        latency_row(
            "idle",
            f"enqueue → dispatch claim, idle worker ({len(samples)}/{items} claimed,"
            f" {here} by the committing process)",
            samples,
            target_key="p99",
            target_ms=20,
        )
    ]


def run(stack: Stack) -> list[Row]:
    rows = idle_cpu(stack, seconds=stack.n(60, 10))
    rows += enqueue_to_dispatch(stack, items=stack.n(100, 20))
    return rows
