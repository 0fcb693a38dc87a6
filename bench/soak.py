"""The leakage soak (`make soak`): the stop/dispatch race of `tests/dispatch/test_leakage_race.py`,
for a long time, on PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        .venv/bin/python bench/soak.py

It reuses the test's machinery (`tests/dispatch/race.py`: the dispatcher processes, the run
supply, a round of the race and the tally) on a database of its own (`BENCH_DB_NAME`, default
`safestop_soak`, dropped and recreated), with 8 dispatcher processes and 2 agent processes that
prepare runs (each with 20 pending webhook items) ahead of the race. Each round races
`SOAK_RUNS_PER_ROUND` runs at once: every dispatcher scans its share of their items (each item
is in two snapshots), all start together, and each run is stopped at its own random moment in
the first 80 % of the dispatch window. A round with several runs is what lets ten thousand stops
fit in half an hour on two shared cores; a single-run round (the CI test) costs a whole window
per stop.

With `SOAK_CELERY=1` a real Celery worker (solo pool, the production dispatcher's task
`runs.tasks.dispatch_outbox_item`, on its own queue in Redis database `BENCH_REDIS_DB`) is a
third contender for every item: at each round's start the soak queues one task per item, like
the dispatch kick does in production. It runs without beat, because beat's `dispatch_pending`
would send the prepared runs' items before their round begins. The worker's VmRSS/VmHWM is
sampled from /proc every `SOAK_RSS_EVERY` seconds and summarised at the end.

It ends when `SOAK_STOPS` stops (default 10,000) are done or `SOAK_SECONDS` (default 1800) have
passed, waits for the Celery queue to drain, then prints the tally: leaks (an item received
although its run's stop froze it, or claimed after the stop, or at another epoch), duplicates
(a key received twice) and throughput. Exit status 1 on any leak, duplicate or inconsistency.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    PYTHON,
    machine,
    recreate_database,
    rss_kib,
    with_database,
    with_redis_db,
)


def setting(name: str, default: str) -> str:
    return os.environ.get(name) or default


STOPS = int(setting("SOAK_STOPS", "10000"))
SECONDS = float(setting("SOAK_SECONDS", "1800"))
DISPATCHERS = int(setting("SOAK_DISPATCHERS", "8"))
AGENTS = int(setting("SOAK_AGENTS", "2"))
ITEMS = int(setting("SOAK_ITEMS", "4"))
RUNS_PER_ROUND = int(setting("SOAK_RUNS_PER_ROUND", "16"))
CELERY = setting("SOAK_CELERY", "0") not in ("0", "", "no", "false")
RSS_EVERY = float(setting("SOAK_RSS_EVERY", "30"))
PROGRESS_EVERY = float(setting("SOAK_PROGRESS_EVERY", "60"))
# The worker may lag the dispatcher processes (one solo process against eight): past this many
# queued tasks a round waits, so the queue (and the final drain) stays bounded.
CELERY_BACKLOG = int(setting("SOAK_CELERY_BACKLOG", str(4 * RUNS_PER_ROUND * ITEMS)))
# A line when this many stops are done, for runs told to go on longer (an hour, for the worker's memory).
MILESTONE = int(setting("SOAK_MILESTONE", "10000"))
# With SOAK_CELERY: trace the worker's allocations (bench/soak_worker.py) and print what grew.
TRACEMALLOC = setting("SOAK_TRACEMALLOC", "0") not in ("0", "", "no", "false")
TRACE_EVERY = float(setting("SOAK_TRACE_EVERY", "300"))
SEED = int(setting("SOAK_SEED", str(time.time_ns())))
LOG_DIR = Path(setting("SOAK_LOG_DIR", str(ROOT / "bench" / "results" / "soak")))


def say(message: str) -> None:
    load = "/".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"[{time.strftime('%H:%M:%S')} load {load}] {message}", flush=True)


# --------------------------------------------------------------------------------------------
# the database and Django


def prepare_database() -> tuple[str, str]:
    admin_url = setting("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    name = setting("BENCH_DB_NAME", "safestop_soak")
    url = with_database(admin_url, name)
    recreate_database(admin_url, name)
    # Durability on a crash is not what the soak is about, and an fsync per commit would make
    # ten thousand stops take hours; locking and visibility are unaffected (as in the CI test).
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(name))
        )
    os.environ["DATABASE_URL"] = url
    # The soak process itself talks to no channel layer and queues no kick: it only stops runs.
    broker = os.environ.pop("REDIS_URL", "redis://127.0.0.1:6379/0")
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ.setdefault("SAFESTOP_LOG_LEVEL", "WARNING")
    subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url},
        check=True,
    )
    import django

    django.setup()
    return name, broker


# --------------------------------------------------------------------------------------------
# the Celery worker and its memory


@dataclass
class CeleryContender:
    """A real worker on its own queue, the client that feeds it, and its RSS samples."""

    broker: str
    queue: str
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[Any] | None = None
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (s, VmRSS, VmHWM)
    trace_dir: Path = LOG_DIR / "tracemalloc"
    queued: int = 0
    waited: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        from celery import Celery

        self._log = self.log_path.open("w")
        launcher = [PYTHON, "-m", "celery"]
        if TRACEMALLOC:
            for stale in self.trace_dir.glob("snapshot-*.tracemalloc"):
                stale.unlink()
            launcher = [PYTHON, "bench/soak_worker.py", str(self.trace_dir), str(TRACE_EVERY)]
        self.process = subprocess.Popen(
            [
                *launcher,
                "-A",
                "console",
                "worker",
                "--pool=solo",
                "--loglevel=WARNING",
                "--without-mingle",
                "--without-gossip",
                "--without-heartbeat",
                f"--hostname={self.queue}@%h",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.client = Celery("soak-client", broker=self.broker)
        self.client.conf.task_default_queue = self.queue
        import redis

        self.redis = redis.Redis.from_url(self.broker)
        self.started = time.monotonic()
        threading.Thread(target=self._sample, name="rss-sampler", daemon=True).start()

    def _sample(self) -> None:
        assert self.process is not None
        while not self._stop.is_set() and self.process.poll() is None:
            try:
                figures = rss_kib(self.process.pid)
            except OSError:
                return
            self.samples.append(
                (time.monotonic() - self.started, figures["VmRSS"], figures["VmHWM"])
            )
            self._stop.wait(RSS_EVERY)

    def backlog(self) -> int:
        return int(self.redis.llen(self.queue))

    def wait_for_room(self, deadline: float) -> None:
        began = time.monotonic()
        while self.backlog() > CELERY_BACKLOG and time.monotonic() < deadline:
            self.check_alive()
            time.sleep(0.05)
        self.waited += time.monotonic() - began

    def check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the Celery worker exited; see {self.log_path}")

    def queue_round(self, run_ids: list[str]) -> None:
        from tests.dispatch.dispatcher_proc import scan

        for item_id in scan(run_ids):
            self.client.send_task("runs.tasks.dispatch_outbox_item", args=[item_id])
            self.queued += 1

    def drain(self, timeout: float) -> bool:
        """Wait until the queue is empty and no item is still being dispatched."""
        from runs.models import OutboxItem, OutboxStatus

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            busy = OutboxItem.objects.filter(status=OutboxStatus.DISPATCHING).exists()
            if self.backlog() == 0 and not busy:
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        self._stop.set()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        # The queue and kombu's bindings for it: nothing of this soak stays in Redis.
        ours = list(self.redis.scan_iter(match=f"*{self.queue}*"))
        if ours:
            self.redis.delete(*ours)
        self.client.close()

    def curve(self) -> list[str]:
        """RSS at start, every quarter hour, and the peak (MiB)."""
        if not self.samples:
            return ["no RSS samples"]
        lines = []
        for minute in range(0, int(self.samples[-1][0] // 60) + 1, 15):
            at, rss, hwm = min(self.samples, key=lambda sample: abs(sample[0] - minute * 60))
            lines.append(
                f"  t={at / 60:5.1f} min  VmRSS={rss / 1024:6.1f} MiB  VmHWM={hwm / 1024:6.1f} MiB"
            )
        at, rss, hwm = self.samples[-1]
        lines.append(
            f"  end t={at / 60:5.1f} min  VmRSS={rss / 1024:6.1f} MiB  "
            f"peak VmHWM={max(s[2] for s in self.samples) / 1024:6.1f} MiB  "
            f"({len(self.samples)} samples every {RSS_EVERY:g} s)"
        )
        return lines


# --------------------------------------------------------------------------------------------
# the soak


class KeyReceiver:
    """The tests' webhook receiver, keeping only the idempotency keys: a soak receives a hundred
    thousand requests and their headers would cost hundreds of MiB in this process."""

    def __new__(cls):  # type: ignore[no-untyped-def]
        from tests.support.dispatch_receiver import Receipt, WebhookReceiver

        class Receiver(WebhookReceiver):
            def _record(self, receipt: Receipt) -> None:
                super()._record(Receipt("", receipt.idempotency_key, None, {}, receipt.at))

        return Receiver()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    # Through the `finally` below: the worker and the dispatchers are stopped, not orphaned.
    sys.exit(128 + signum)


def soak() -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    db_name, broker = prepare_database()
    from runs import services
    from runs.actors import Actor
    from runs.models import OutboxItem, OutboxStatus
    from runs.tokens import team_ensure
    from tests.dispatch.race import DispatcherProcess, RunSupply, race_round, tally
    from tests.support.children import child_env

    reviewer = Actor.system("reviewer-soak")
    team = team_ensure(slug="soak", name="Soak")
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    receiver = KeyReceiver().start()
    say(
        f"soak: database={db_name} stops={STOPS} seconds={SECONDS:g} dispatchers={DISPATCHERS} "
        f"agents={AGENTS} items_per_run={ITEMS} runs_per_round={RUNS_PER_ROUND} "
        f"celery={'yes' if CELERY else 'no'} seed={SEED}"
    )
    say("machine: " + json.dumps({k: v for k, v in machine().items() if k != "memory"}))
    env = child_env(SAFESTOP_WEBHOOK_ALLOWED_HOSTS=receiver.host)
    dispatchers = [
        DispatcherProcess(allowed_hosts=receiver.host, env=env) for _ in range(DISPATCHERS)
    ]
    agents = [DispatcherProcess(allowed_hosts=receiver.host, env=env) for _ in range(AGENTS)]
    worker = None
    if CELERY:
        redis_url = with_redis_db(broker, int(setting("BENCH_REDIS_DB", "10")))
        queue = f"safestop-soak-{os.getpid()}"
        worker = CeleryContender(
            broker=redis_url,
            queue=queue,
            env={**env, "REDIS_URL": redis_url, "SAFESTOP_CELERY_QUEUE": queue},
            log_path=LOG_DIR / "celery-worker.log",
        )
        worker.start()
    supply = RunSupply(
        agents,
        team_slug=team.slug,
        url=receiver.url("/hook"),
        total=STOPS + RUNS_PER_ROUND,
        items=ITEMS,
        batch=RUNS_PER_ROUND,
    )

    def stop(run_id: str) -> services.StopOutcome:
        return services.run_stop(run_id=run_id, reason="user_stop", actor=reviewer)

    rng = random.Random(SEED)
    timeout = max(60.0, RUNS_PER_ROUND * ITEMS * 0.5)
    stops: dict[str, object] = {}
    try:
        # A probe round (nobody stopping) measures the dispatch window; its runs are not counted.
        probe = supply.take(RUNS_PER_ROUND)
        probe_stops, window = race_round(
            dispatchers, probe, None, items=ITEMS, stop=stop, timeout=timeout
        )
        say(f"probe round: window {window * 1000:.0f} ms for {RUNS_PER_ROUND} runs")
        began = time.monotonic()
        deadline = began + SECONDS
        next_progress = began + PROGRESS_EVERY
        rounds = 0
        supply_wait = 0.0
        milestone = min(STOPS, MILESTONE)
        while len(stops) < STOPS and time.monotonic() < deadline:
            asked = time.monotonic()
            run_ids = supply.take(min(RUNS_PER_ROUND, STOPS - len(stops)))
            supply_wait += time.monotonic() - asked
            offsets = [rng.uniform(0, window * 0.8) for _ in run_ids]
            on_go = None
            if worker is not None:
                worker.wait_for_room(deadline)
                on_go = lambda ids=run_ids: worker.queue_round(ids)  # noqa: E731
            outcomes, elapsed = race_round(
                dispatchers, run_ids, offsets, items=ITEMS, stop=stop, on_go=on_go, timeout=timeout
            )
            stops.update(outcomes)
            rounds += 1
            all_sent = _runs_all_sent(OutboxItem, OutboxStatus, run_ids)
            if all_sent * 2 > len(run_ids):
                # Most runs had everything out before their stop: the machine got faster (shared
                # cores); follow it, so stops keep landing among the claims.
                window = 0.7 * window + 0.3 * elapsed
            if len(stops) >= milestone:
                milestone = STOPS + 1
                say(f"milestone: {len(stops)} stops done after {time.monotonic() - began:.0f} s")
                _progress(stops, receiver, began, window, worker)
            if time.monotonic() >= next_progress:
                next_progress += PROGRESS_EVERY
                _progress(stops, receiver, began, window, worker)
        raced = time.monotonic() - began
        if worker is not None and not worker.drain(timeout=600):
            say("the Celery queue did not drain within 10 minutes")
        # The probe's runs are judged too: their items were received like everyone else's.
        result = tally({**probe_stops, **stops}, receiver.keys(), items=ITEMS)
    finally:
        for process in (*dispatchers, *agents):
            process.close()
        if worker is not None:
            worker.stop()
        receiver.close()

    say(f"soak tally: {result.line()}")
    say(
        f"soak throughput: stops={len(stops)} rounds={rounds} in {raced:.0f} s: "
        f"{len(stops) / raced:.2f} stops/s, {result.sent / raced:.1f} items sent/s, "
        f"{result.items / raced:.1f} items settled/s; last window {window * 1000:.0f} ms; "
        f"rounds waited {supply_wait:.0f} s for prepared runs"
    )
    if worker is not None:
        say(
            f"celery: {worker.queued} tasks queued, rounds waited {worker.waited:.0f} s for the "
            f"worker; RSS curve:"
        )
        for line in worker.curve():
            print(line, flush=True)
        (LOG_DIR / "celery-rss.json").write_text(json.dumps(worker.samples))
        if TRACEMALLOC:
            for line in _allocation_growth(worker.trace_dir):
                print(line, flush=True)
    for example in result.examples:
        say(f"problem: {example}")
    verdict = "PASS" if result.clean else "FAIL"
    say(
        f"soak {verdict}: leaks={result.leaks} duplicates={result.duplicates} "
        f"inconsistent={result.inconsistent} unknown_keys={result.unknown_keys}"
    )
    return 0 if result.clean else 1


def _snapshot_seconds(path: Path) -> int:
    return int(path.stem.split("-")[1])


def _allocation_growth(directory: Path, top: int = 15) -> list[str]:
    """Where the worker's traced memory grew over the second half of the soak: the baseline is
    the first snapshot at or after half the last one's age, well past the warm-up (imports,
    connections, the first tasks), which on loaded cores takes minutes."""
    import tracemalloc

    paths = sorted(directory.glob("snapshot-*.tracemalloc"), key=_snapshot_seconds)
    if len(paths) < 3:
        return [f"tracemalloc: {len(paths)} snapshots, too few to compare"]
    half = _snapshot_seconds(paths[-1]) / 2
    baseline = next(path for path in paths if _snapshot_seconds(path) >= half)
    ignore = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
    ]
    first = tracemalloc.Snapshot.load(str(baseline)).filter_traces(ignore)
    last = tracemalloc.Snapshot.load(str(paths[-1])).filter_traces(ignore)
    total = sum(stat.size for stat in last.statistics("filename")) - sum(
        stat.size for stat in first.statistics("filename")
    )
    lines = [f"tracemalloc: {baseline.name} -> {paths[-1].name}: {total / 1024:+.1f} KiB traced"]
    for stat in last.compare_to(first, "traceback")[:top]:
        # Oldest frame first in a Traceback: the allocating line is the last one.
        recent = list(stat.traceback)[-4:][::-1]
        frames = " <- ".join(f"{frame.filename}:{frame.lineno}" for frame in recent)
        lines.append(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {frames}")
    return lines


def _runs_all_sent(model: Any, status: Any, run_ids: list[str]) -> int:
    sent = Counter(
        model.objects.filter(run_id__in=run_ids, status=status.SENT).values_list(
            "run_id", flat=True
        )
    )
    return sum(1 for run_id in run_ids if sent[run_id] == ITEMS)


def _progress(
    stops: dict[str, object],
    receiver: Any,
    began: float,
    window: float,
    worker: CeleryContender | None,
) -> None:
    keys = receiver.keys()
    duplicates = sum(1 for n in Counter(keys).values() if n > 1)
    elapsed = time.monotonic() - began
    line = (
        f"{len(stops)} stops in {elapsed:.0f} s ({len(stops) / elapsed:.2f}/s), "
        f"{len(keys)} receipts, {duplicates} duplicate keys, window {window * 1000:.0f} ms"
    )
    if worker is not None and worker.samples:
        _at, rss, hwm = worker.samples[-1]
        line += (
            f", celery backlog {worker.backlog()} VmRSS {rss / 1024:.1f} MiB "
            f"VmHWM {hwm / 1024:.1f} MiB"
        )
    say(line)


if __name__ == "__main__":
    sys.exit(soak())
