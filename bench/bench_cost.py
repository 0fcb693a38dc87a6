"""CPU time per operation, by process kind: what sizing a deployment rests on.

Wall-clock rates on a shared 2-core machine measure the queue for the CPU as much as the work;
CPU time per operation does not (much). For each operation this section runs it N times one
after another and reads, before and after, the CPU time (user + system, `/proc/<pid>/stat`,
what psutil's `cpu_times` reads) of every process of each kind of the production shape:

- **daphne**: one `daphne console.asgi:application` (docker-compose.yml's `web`) of its own;
- **Celery**: one worker with embedded beat (its process tree), as `bench.stack.start_celery`;
- **PostgreSQL**: the backends connected to the bench database (`pg_stat_activity`, by pid;
  a sampler thread catches backends that come and go; the sampler's own backend is left out);
- **Redis**: a `redis-server` of this section's own on a free port — the machine's Redis serves
  every other session on it, so its CPU could not be told apart.

Operations (each from its own client in this process, which is not counted):

- **event**: one single-event `POST /events/` (and, per event, a batch of 100);
- **permit**: one `POST /permits/` (a tool call's intent record, no approval rule);
- **stop**: `POST /cancel/` of a run whose `safestop_agent` worker (bench/agent_worker.py,
  its own process, not counted) holds the lease and its push socket, until the worker has
  drained: the stop, the signal pushed to the worker, its acknowledgement and `drained`, the
  settle and the stop packet;
- **HTTP floor** (a JSON 404, no auth, no database) and **idle** (nothing asked, 15 s; each
  kind's idle CPU over an operation's wall time is subtracted from it);
- **viewer frame**: 200 browser viewers of one run (bench/ws_viewers.py, not counted) while
  this process commits 10 changes a second; CPU per delivered frame (the change's own commit is
  this process's, not counted; daphne's and Redis's share of it is the frame's).

The per-core capacities in docs/OPERATIONS.md come from these rows.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.common import PYTHON, ROOT, Managed, Row, free_port, start, wait_for_port
from bench.stack import LineProcess, Stack

KINDS = ("daphne", "celery", "postgres", "redis")


# --------------------------------------------------------------------------------------------
# CPU time of processes


def _ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def process_tree(pid: int) -> list[int]:
    pids = [pid]
    for parent in pids:
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    pids += [int(child) for child in children.read().split()]
        except OSError:
            continue
    return pids


def _own_tcp_ports() -> set[int]:
    """Local ports of this process's TCP sockets (/proc/self/fd → inode → /proc/self/net/tcp*)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()
                    if fields[9] in inodes:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


class Backends:
    """The bench database's PostgreSQL backends, sampled by pid while an operation runs:
    a backend that exits between two samples keeps the CPU it was last seen with."""

    def __init__(self, dsn: str, every: float = 0.2) -> None:
        import psycopg

        self._conn = psycopg.connect(dsn, autocommit=True)
        self._own = self._conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
        self.every = every
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.excluded: set[int] = {self._own}

    def _pids(self) -> list[int]:
        # The bench process's own connections (its Django pool: the fan-out's commits, the
        # runs it prepares) are the client's work, not the server's: left out by client port.
        rows = self._conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
        own = _own_tcp_ports()
        return [pid for pid, port in rows if pid not in self.excluded and port not in own]

    def sample(self, *, opening: bool = False) -> None:
        for pid in self._pids():
            ticks = _ticks(pid)
            if ticks is None:
                continue
            if pid not in self.first:
                # Seen at the opening sample: its CPU so far is not ours. Born later: all of it is.
                self.first[pid] = ticks if opening else 0
            self.last[pid] = ticks

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> Backends:
        self.first, self.last = {}, {}
        self.sample(opening=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self.sample()

    def seconds(self) -> float:
        ticks = sum(self.last[pid] - self.first[pid] for pid in self.last)
        return ticks / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self._conn.close()


@dataclasses.dataclass
class Shape:
    """The processes whose CPU is counted."""

    daphne: Managed
    celery: Managed
    redis: subprocess.Popen[Any]
    backends: Backends

    def pids(self) -> dict[str, list[int]]:
        return {
            "daphne": process_tree(self.daphne.pid),
            "celery": process_tree(self.celery.pid),
            "redis": [self.redis.pid],
        }

    def measure(self, work: Callable[[], int]) -> tuple[int, dict[str, float], float, float]:
        """Run `work` (it returns how many operations it did): (count, CPU seconds by kind,
        wall seconds, 1-min load average at the start)."""
        pids = self.pids()
        load = os.getloadavg()[0]
        before = {kind: sum(t or 0 for t in map(_ticks, group)) for kind, group in pids.items()}
        started = time.monotonic()
        with self.backends:
            count = work()
        wall = time.monotonic() - started
        hz = os.sysconf("SC_CLK_TCK")
        spent = {
            kind: (sum(t or 0 for t in map(_ticks, group)) - before[kind]) / hz
            for kind, group in pids.items()
        }
        spent["postgres"] = self.backends.seconds()
        return count, spent, wall, load


# --------------------------------------------------------------------------------------------
# the shape


def _start_redis(log_dir: Path) -> tuple[subprocess.Popen[Any], int]:
    port = free_port()
    log = open(log_dir / "cost-redis.log", "wb")  # noqa: SIM115  (the child owns it)
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_port(port, timeout=20, process=process)
    return process, port


def _start_daphne(stack: Stack, env: dict[str, str]) -> tuple[Managed, int]:
    port = free_port()
    daphne = start(
        "cost-daphne",
        [
            PYTHON,
            "-m",
            "daphne",
            "--proxy-headers",
            "--websocket_connect_timeout",
            "20",
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "console.asgi:application",
        ],
        env,
        stack.log_dir,
    )
    wait_for_port(port, timeout=60, process=daphne.process)
    return daphne, port


# --------------------------------------------------------------------------------------------
# the operations


def _warm(http: httpx.Client, run_id: str, epoch: int) -> None:
    for index in range(20):
        http.post(
            f"/api/v1/runs/{run_id}/events/",
            json={
                "epoch": epoch,
                "events": [
                    {"event_id": f"warm-{index}", "type": "step.started", "key": f"w{index}"}
                ],
            },
        )


def idle(shape: Shape, seconds: float) -> tuple[int, dict[str, float], float, float]:
    """Nothing asked of the shape: what each kind spends on its own (polls, timers, the beat),
    per second; subtracted from every operation's window."""

    def work() -> int:
        time.sleep(seconds)
        return 1

    return shape.measure(work)


def floor(stack: Stack, shape: Shape, count: int) -> tuple[int, dict[str, float], float, float]:
    """bench_ingest.py's HTTP floor (a JSON 404 through the whole middleware stack, no auth, no
    database): what any request costs before its own work."""
    with httpx.Client(base_url=stack.base_url, timeout=30) as http:
        for _ in range(20):
            http.get("/api/v1/no-such-endpoint/")

        def work() -> int:
            for _ in range(count):
                if http.get("/api/v1/no-such-endpoint/").status_code != 404:
                    raise RuntimeError("floor request did not answer 404")
            return count

        return shape.measure(work)


def _events(
    stack: Stack, shape: Shape, title: str, requests: int, body: Any, per_request: int
) -> tuple[int, dict[str, float], float, float]:
    """`requests` POSTs of `body(number)` to one leased run's events, each accepting
    `per_request` events; the count of events sent."""
    from bench.bench_ingest import _leased_runs

    ((run_id, epoch),) = _leased_runs(stack, 1, title)
    with httpx.Client(
        base_url=stack.base_url,
        headers={"Authorization": f"Bearer {stack.agent_token}"},
        timeout=30,
    ) as http:
        _warm(http, run_id, epoch)

        def work() -> int:
            for number in range(requests):
                response = http.post(
                    f"/api/v1/runs/{run_id}/events/",
                    json={"epoch": epoch, "events": body(number)},
                )
                if response.status_code != 200 or response.json()["accepted"] != per_request:
                    raise RuntimeError(
                        f"events answered {response.status_code}: {response.text[:200]}"
                    )
            return requests * per_request

        return shape.measure(work)


def events_single(
    stack: Stack, shape: Shape, count: int
) -> tuple[int, dict[str, float], float, float]:
    from bench.bench_ingest import single_event

    return _events(stack, shape, "cost-single", count, lambda n: [single_event(0, n)], 1)


def events_batched(
    stack: Stack, shape: Shape, batches: int
) -> tuple[int, dict[str, float], float, float]:
    from bench.bench_ingest import BATCH, batch_events

    return _events(stack, shape, "cost-batch", batches, lambda n: batch_events(0, n), BATCH)


def permits(stack: Stack, shape: Shape, count: int) -> tuple[int, dict[str, float], float, float]:
    from bench.bench_ingest import _leased_runs

    ((run_id, epoch),) = _leased_runs(stack, 1, "cost-permit")
    with httpx.Client(
        base_url=stack.base_url,
        headers={"Authorization": f"Bearer {stack.agent_token}"},
        timeout=30,
    ) as http:
        _warm(http, run_id, epoch)

        def ask(number: int) -> None:
            response = http.post(
                f"/api/v1/runs/{run_id}/permits/",
                json={
                    "epoch": epoch,
                    "tool_call_id": f"call-{number}",
                    "tool": "fetch_page",
                    "arguments": {"page": number},
                },
            )
            if response.status_code != 201:
                raise RuntimeError(f"permit answered {response.status_code}: {response.text[:200]}")

        for number in range(5):
            ask(-1 - number)

        def work() -> int:
            for number in range(count):
                ask(number)
            return count

        return shape.measure(work)


def stops(stack: Stack, shape: Shape, count: int) -> tuple[int, dict[str, float], float, float]:
    from bench.bench_scale import Worker

    worker = Worker(stack, stack.base_url, "cost-worker")
    totals = {kind: 0.0 for kind in KINDS}
    wall = 0.0
    load = os.getloadavg()[0]
    try:
        with httpx.Client(
            base_url=stack.base_url,
            headers={"Authorization": f"Bearer {stack.reviewer_token}"},
            timeout=30,
        ) as http:
            for index in range(count + 3):
                # The lease and the push socket are the run's start, not its stop: outside.
                run = worker.leased_run(f"Cost stop #{index}")

                def work(run_id: str = run.pk) -> int:
                    response = http.post(
                        f"/api/v1/runs/{run_id}/cancel/", json={"reason": "user_stop"}
                    )
                    if response.status_code != 202:
                        raise RuntimeError(f"cancel answered {response.status_code}")
                    worker.finished(run_id)
                    return 1

                _done, spent, seconds, _load = shape.measure(work)
                if index < 3:
                    continue  # warm-up
                wall += seconds
                for kind in KINDS:
                    totals[kind] += spent[kind]
    finally:
        worker.close()
    return count, totals, wall, load


def viewer_frames(
    stack: Stack, shape: Shape, viewers: int, rate: float, seconds: float
) -> tuple[int, dict[str, float], float, float]:
    from bench.bench_fanout import USERS, _drive, _sessions
    from runs import services
    from runs.actors import Actor
    from runs.models import Team

    system = Actor.system("bench")
    run_obj = services.run_create(
        team=Team.objects.get(pk=stack.team_id),
        title="Watched run (cost)",
        agent="research-agent",
        actor=system,
    )
    lease = services.lease_acquire(
        run_id=run_obj.pk, worker_id="cost-researcher", ttl_seconds=3600, actor=system
    )
    cookies = _sessions(stack, min(USERS, viewers))
    restore = _layers_on(stack.env["REDIS_URL"])
    client = LineProcess(
        [
            PYTHON,
            str(ROOT / "bench" / "ws_viewers.py"),
            "--url",
            f"ws://127.0.0.1:{stack.port}/ws/runs/{run_obj.pk}/",
            "--origin",
            f"http://127.0.0.1:{stack.port}",
            "--cookies",
            ",".join(cookies),
            "--count",
            str(viewers),
        ],
        stack.env,
        stack.log_dir / "ws_viewers-cost.log",
    )
    try:
        hello = client.receive(timeout=120)
        if hello.get("connected") != viewers:
            raise RuntimeError(f"only {hello.get('connected')} of {viewers} viewers connected")
        time.sleep(0.5)
        report: dict[str, Any] = {}

        def work() -> int:
            _drive(stack, run_obj.pk, lease.epoch, rate, seconds)
            client.send({"op": "report", "quiet": 1.0, "max_wait": 30})
            report.update(client.receive(timeout=120))
            return int(report["frames"])

        return shape.measure(work)
    finally:
        client.close()
        restore()


def _layers_on(redis_url: str) -> Callable[[], None]:
    """This process's channel layers on `redis_url` (the section's Redis) until the returned
    function is called: the changes the fan-out commits here must reach the section's daphne."""
    from channels.layers import channel_layers
    from django.conf import settings

    original = settings.CHANNEL_LAYERS
    settings.CHANNEL_LAYERS = {
        alias: {
            **config,
            "CONFIG": {
                **config["CONFIG"],
                "hosts": [{**host, "address": redis_url} for host in config["CONFIG"]["hosts"]],
            },
        }
        for alias, config in original.items()
    }
    channel_layers.backends = {}

    def restore() -> None:
        settings.CHANNEL_LAYERS = original
        channel_layers.backends = {}

    return restore


# --------------------------------------------------------------------------------------------


def _row(
    name: str,
    unit: str,
    measured: tuple[int, dict[str, float], float, float],
    note: str,
    idle_rate: dict[str, float],
) -> Row:
    """µs per operation by kind, net of what each kind spends idle over the same wall time."""
    count, spent, wall, load = measured
    gross = {kind: spent[kind] * 1e6 / max(count, 1) for kind in KINDS}
    per = {
        kind: max(0.0, spent[kind] - idle_rate[kind] * wall) * 1e6 / max(count, 1) for kind in KINDS
    }
    total = sum(per.values())
    shown = ", ".join(f"{kind} {per[kind]:,.0f}" for kind in KINDS)
    return Row(
        "cost",
        f"CPU per {name}",
        {
            "value": total,
            "count": count,
            "per_kind_us": per,
            "gross_per_kind_us": gross,
            "wall_s": wall,
            "load": load,
        },
        "µs",
        note=f"µs per {unit} net of idle: {shown} (gross daphne {gross['daphne']:,.0f}); "
        f"{count:,} in {wall:.1f} s; load average {load:.2f}; {note}",
    )


OPERATIONS: tuple[tuple[str, str, str, Callable[[Stack, Shape], Any]], ...] = (
    (
        "HTTP floor request",
        "request",
        "a JSON 404 through the whole middleware stack (no auth, no database), one client",
        lambda stack, shape: floor(stack, shape, stack.n(400, 60)),
    ),
    (
        "single event",
        "event",
        "one POST /events/ of one event, one client",
        lambda stack, shape: events_single(stack, shape, stack.n(400, 60)),
    ),
    (
        "event in a batch of 100",
        "event",
        "POST /events/ of 100 events, one client",
        lambda stack, shape: events_batched(stack, shape, stack.n(20, 4)),
    ),
    (
        "permit",
        "permit",
        "one POST /permits/, one client",
        lambda stack, shape: permits(stack, shape, stack.n(300, 40)),
    ),
    (
        "stop",
        "stop",
        "POST /cancel/ → signal at a safestop_agent worker → its ack and drained",
        lambda stack, shape: stops(stack, shape, stack.n(30, 5)),
    ),
    (
        "viewer frame",
        "frame",
        "viewers of one run, 10 changes a second committed by the bench",
        lambda stack, shape: viewer_frames(
            stack, shape, stack.n(200, 50), 10.0, stack.n(10.0, 4.0)
        ),
    ),
)


def run(stack: Stack) -> list[Row]:
    """Its own Redis, daphne and Celery worker on the bench database (see the module)."""
    import django.db

    redis, redis_port = _start_redis(stack.log_dir)
    # The same database number as the stack's: the viewers layer's prefix comes from it, and
    # this process publishes the fan-out's changes with its own settings (`_layers_on`).
    db = stack.env["REDIS_URL"].rsplit("/", 1)[-1] or "0"
    env = {**stack.env, "REDIS_URL": f"redis://127.0.0.1:{redis_port}/{db}"}
    daphne: Managed | None = None
    costed: Stack | None = None
    backends: Backends | None = None
    rows: list[Row] = []
    try:
        daphne, port = _start_daphne(stack, env)
        costed = dataclasses.replace(
            stack,
            env=env,
            port=port,
            base_url=f"http://127.0.0.1:{port}",
            daphne=daphne,
            celery=None,
        )
        celery = costed.start_celery()
        dsn = django.db.connection.settings_dict
        backends = Backends(
            f"host={dsn['HOST']} port={dsn['PORT']} user={dsn['USER']} dbname={dsn['NAME']}"
            + (f" password={dsn['PASSWORD']}" if dsn.get("PASSWORD") else "")
        )
        shape = Shape(daphne=daphne, celery=celery, redis=redis, backends=backends)
        time.sleep(3.0)  # let the worker's first beat pass
        _count, spent, wall, load = idle(shape, costed.n(15.0, 4.0))
        idle_rate = {kind: spent[kind] / wall for kind in KINDS}
        rows.append(
            Row(
                "cost",
                "idle CPU, % of one core",
                {"value": 100 * sum(idle_rate.values()), "per_kind": idle_rate},
                "%",
                note=", ".join(f"{kind} {100 * idle_rate[kind]:.2f} %" for kind in KINDS)
                + f" over {wall:.0f} s; load average {load:.2f}; subtracted from each row below",
            )
        )
        for name, unit, note, operation in OPERATIONS:
            rows.append(_row(name, unit, operation(costed, shape), note, idle_rate))
    finally:
        if costed is not None:
            costed.stop_celery()
        if daphne is not None:
            daphne.stop()
        if backends is not None:
            backends.close()
        redis.terminate()
        redis.wait(10)
    return rows
