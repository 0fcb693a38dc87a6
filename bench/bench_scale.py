"""Scale-out: 1, 2 and 4 daphne processes behind nginx, the way production runs.

Each daphne is started with the production command (docker-compose.yml's `web`:
`daphne --proxy-headers console.asgi:application`) on a loopback port, all on the bench's
database and Redis; nginx runs the committed deploy/nginx/safestop.conf (bench/nginx.py) with
those ports as its upstream. Measured:

1. ingestion through the proxy (batches of 100 and single events, the clients of
   bench/bench_ingest.py, the same 8 client threads for every process count) with 1, 2 and 4
   daphne, and the 1 → 2 and 1 → 4 ratios; one direct (no proxy) figure for the proxy's cost;
2. the stop path through the proxy (worker and reviewer both through nginx, 2 daphne):
   POST /cancel/ → signal at the worker, → drained;
3. the cross-process stop: the worker's push socket on daphne A, the stop taken by daphne B
   (POST /cancel/ sent to B): request → signal, and B's `requested_at` (stamped before B's
   commit, so an upper bound of commit → signal) → signal; plus a stop committed in this
   process (a third one) → signal through A, timed exactly by the commit clock;
4. the fan-out: 1,000 browser viewers through nginx across 2 daphne (bench/ws_viewers.py,
   several client processes), commit → arrival for every (viewer, seq), gaps by seq, the peak
   RSS of each daphne;
5. memory: 1,000 viewers on ONE daphne (proxy with one upstream), its RSS with the sockets
   open and its peak while frames flow.
"""

from __future__ import annotations

import json
import os
import resource
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import nginx
from bench.common import (
    PYTHON,
    ROOT,
    Managed,
    Row,
    free_port,
    latency_row,
    rate_row,
    rss_kib,
    start,
    summary,
    wait_for_port,
)
from bench.stack import LineProcess, Stack

PROCESS_COUNTS = (1, 2, 4)
# One set of clients for every process count, enough to keep four daphne busy: the ratio then
# says what the extra processes bring, not what extra clients bring.
CLIENTS = 8
VIEWERS = 1000
# BENCH_SCALE_PARTS=stop,fanout runs a subset (all three by default).
PARTS = frozenset(os.environ.get("BENCH_SCALE_PARTS", "ingest,stop,fanout").split(","))
VIEWER_PROCESSES = 4
# (daphne processes, changes a second): 1,000 viewers at 10/s is 10,000 frames/s, at 2/s the
# 2,000 frames/s of the single-process fan-out's 200 viewers at 10/s (bench/bench_fanout.py).
# BENCH_SCALE_FANOUTS=2:2 measures only the target's shape (processes:changes a second, by commas).
FANOUTS = tuple(
    (int(processes), float(rate))
    for processes, rate in (
        part.split(":")
        for part in os.environ.get("BENCH_SCALE_FANOUTS", "2:10,2:2,1:2").split(",")
        if part
    )
)


def raise_fd_limit() -> int:
    """1,000 sockets need more than the common soft limit of 1,024 descriptors; children
    (daphne, the viewer clients) inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class Farm:
    """The daphne processes, each on its own loopback port."""

    daphnes: list[Managed]
    ports: list[int]

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def stop(self) -> None:
        for daphne in self.daphnes:
            daphne.stop()


PRODUCTION_APP = "console.asgi:application"
# docker-compose.yml's `web` command line, beside --proxy-headers and the address.
WEB_FLAGS = ("--websocket_connect_timeout", "20")
CLOCKED_APP = "bench.asgi_clocked:application"


def start_farm(
    stack: Stack, apps: list[str], *, env: dict[str, str] | None = None, label: str = "scale"
) -> Farm:
    """One daphne per ASGI application path, each on a free loopback port."""
    daphnes: list[Managed] = []
    ports: list[int] = []
    for index, app in enumerate(apps):
        port = free_port()
        daphnes.append(
            start(
                f"{label}-daphne-{index + 1}",
                [
                    PYTHON,
                    "-m",
                    "daphne",
                    "--proxy-headers",
                    *WEB_FLAGS,
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    app,
                ],
                env or stack.env,
                stack.log_dir,
            )
        )
        ports.append(port)
    for daphne, port in zip(daphnes, ports, strict=True):
        wait_for_port(port, timeout=60, process=daphne.process)
    return Farm(daphnes, ports)


def proxy_for(stack: Stack, farm: Farm, processes: int) -> nginx.Proxy:
    return nginx.start_proxy(
        stack.log_dir / f"nginx-{processes}", farm.ports[:processes], free_port(), stack.env
    )


# --------------------------------------------------------------------------------------------
# 1. ingestion


def process_tree(pid: int) -> list[int]:
    """A process and its descendants (nginx's master and workers), from /proc."""
    pids = [pid]
    for parent in pids:
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    pids += [int(child) for child in children.read().split()]
        except OSError:
            continue
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (/proc/<pid>/stat, fields 14 and 15)."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def _timed(pids: dict[str, list[int]], work: Any) -> tuple[Any, dict[str, float]]:
    """Run `work`; the CPU seconds each group of processes (and this one) spent meanwhile."""
    before = {name: cpu_seconds(group) for name, group in pids.items()}
    own = os.times()
    result = work()
    after_own = os.times()
    spent = {name: cpu_seconds(group) - before[name] for name, group in pids.items()}
    spent["clients"] = (after_own.user - own.user) + (after_own.system - own.system)
    return result, spent


def _ingest_once(stack: Stack, url: str, pids: dict[str, list[int]]) -> dict[str, Any]:
    from bench.bench_ingest import api_batches, api_singles

    batches = stack.n(96, 16) // CLIENTS
    (wall, events, batch_ms), batch_cpu = _timed(
        pids, lambda: api_batches(stack, CLIENTS, batches, 60, base_urls=[url])
    )
    requests = stack.n(800, 160) // CLIENTS
    (single_wall, done, single_ms), single_cpu = _timed(
        pids, lambda: api_singles(stack, CLIENTS, requests, 60, base_urls=[url])
    )
    return {
        "batch_rate": events / wall,
        "batch_ms": batch_ms,
        "events": events,
        # CPU milliseconds per 100-event request / per single-event request, by process group
        "batch_cpu": {name: seconds * 1000 / (events / 100) for name, seconds in batch_cpu.items()},
        "single_rate": done / single_wall,
        "single_ms": single_ms,
        "singles": done,
        "single_cpu": {name: seconds * 1000 / done for name, seconds in single_cpu.items()},
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _joined(rounds: list[dict[str, Any]], key: str, form: str) -> str:
    return " / ".join(form.format(r[key]) for r in rounds)


def _cpu_note(rounds: list[dict[str, Any]], kind: str) -> str:
    names = rounds[0][f"{kind}_cpu"].keys()
    per = {name: _mean([r[f"{kind}_cpu"][name] for r in rounds]) for name in names}
    return "CPU ms per request: " + ", ".join(f"{name} {ms:.1f}" for name, ms in per.items())


def bench_ingest(stack: Stack, farm: Farm) -> list[Row]:
    """Each process count twice, in the order 1 2 4 4 2 1, so a load that drifts during the
    section weighs on every count alike; rates are the mean of the two rounds."""
    from bench.bench_ingest import api_singles

    rows: list[Row] = []
    rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in PROCESS_COUNTS}
    for processes in (*PROCESS_COUNTS, *reversed(PROCESS_COUNTS)):
        proxy = proxy_for(stack, farm, processes)
        pids = {
            "daphne": [daphne.pid for daphne in farm.daphnes[:processes]],
            "nginx": process_tree(proxy.process.pid),
        }
        try:
            api_singles(stack, CLIENTS, 10, 10, base_urls=[proxy.base_url])  # warm every daphne
            load = os.getloadavg()[0]
            figures = _ingest_once(stack, proxy.base_url, pids)
        finally:
            proxy.stop()
        figures["load"] = load
        rounds[processes].append(figures)
    measured: dict[int, dict[str, Any]] = {}
    for processes, done in rounds.items():
        measured[processes] = {
            "batch_rate": _mean([r["batch_rate"] for r in done]),
            "single_rate": _mean([r["single_rate"] for r in done]),
            "load": _mean([r["load"] for r in done]),
        }
        for kind, unit, count in (("batch", "events/s", "events"), ("single", "req/s", "singles")):
            label = "events/s, batches of 100" if kind == "batch" else "single-event requests/s"
            latencies = [ms for r in done for ms in r[f"{kind}_ms"]]
            rows.append(
                rate_row(
                    "scale",
                    f"{label}, {CLIENTS} clients, nginx → {processes} daphne",
                    measured[processes][f"{kind}_rate"],
                    unit,
                    extra={
                        "count": sum(r[count] for r in done),
                        "rounds": [r[f"{kind}_rate"] for r in done],
                        "cpu_ms_per_request": {
                            name: _mean([r[f"{kind}_cpu"][name] for r in done])
                            for name in done[0][f"{kind}_cpu"]
                        },
                        **{
                            key: value
                            for key, value in summary(latencies).items()
                            if key != "count"
                        },
                    },
                    note=f"rounds {_joined(done, kind + '_rate', '{:,.0f}')}; "
                    f"load average {_joined(done, 'load', '{:.1f}')}; "
                    f"{_cpu_note(done, kind)}; latency columns per request (ms)",
                )
            )
    direct = _ingest_once(stack, farm.url(0), {"daphne": [farm.daphnes[0].pid]})
    rows.append(
        rate_row(
            "scale",
            f"single-event requests/s, {CLIENTS} clients, 1 daphne direct (no proxy)",
            direct["single_rate"],
            "req/s",
            extra={"count": direct["singles"], "batch_rate": direct["batch_rate"]},
            note=f"batches direct {direct['batch_rate']:,.0f} events/s; load average "
            f"{os.getloadavg()[0]:.1f}; {_cpu_note([direct], 'single')}; nginx → 1 daphne "
            f"reached singles {measured[1]['single_rate'] / direct['single_rate']:.0%}, "
            f"batches {measured[1]['batch_rate'] / direct['batch_rate']:.0%} of direct",
        )
    )
    for processes in PROCESS_COUNTS[1:]:
        for kind, minimum in (("batch", 1.7), ("single", 1.7)):
            ratio = measured[processes][f"{kind}_rate"] / measured[1][f"{kind}_rate"]
            target = minimum if processes == 2 else None
            rows.append(
                Row(
                    "scale",
                    f"ingestion scaling, {'batches' if kind == 'batch' else 'single events'}, "
                    f"1 → {processes} daphne",
                    {"value": ratio},
                    "×",
                    target=f"≥ {target:g}×" if target else "",
                    judged=ratio if target else None,
                    met=(ratio >= target) if target else None,
                    note=f"load average {measured[1]['load']:.2f} → {measured[processes]['load']:.2f}",
                )
            )
    return rows


# --------------------------------------------------------------------------------------------
# 2. and 3. the stop


class Worker:
    """A safestop_agent worker (bench/agent_worker.py) talking to one base URL."""

    def __init__(self, stack: Stack, url: str, name: str) -> None:
        self.stack = stack
        self.process = LineProcess(
            [
                PYTHON,
                str(ROOT / "bench" / "agent_worker.py"),
                "--url",
                url,
                "--token",
                stack.agent_token,
                "--quantum",
                "0.005",
                "--worker-id",
                name,
            ],
            stack.env,
            stack.log_dir / f"{name}.log",
        )

    def leased_run(self, title: str) -> Any:
        from runs import services
        from runs.actors import Actor
        from runs.models import Team

        run = services.run_create(
            team=Team.objects.get(pk=self.stack.team_id),
            title=title,
            agent="support-agent",
            actor=Actor.system("bench"),
            steps=[services.PlannedStep("triage"), services.PlannedStep("reply")],
        )
        self.process.send({"op": "lease", "run_id": run.pk})
        ready = self.process.receive(timeout=20)
        if "error" in ready or not ready.get("push_connected"):
            raise RuntimeError(f"agent worker not ready: {ready}")
        return run

    def finished(self, run_id: str) -> dict[str, Any]:
        answer = self.process.receive(timeout=30)
        if answer.get("error") or answer.get("run_id") != run_id or answer["signal_at"] is None:
            raise RuntimeError(f"agent worker: {answer}")
        return answer

    def close(self) -> None:
        self.process.close()


class CommitLog:
    """The commit stamps bench/asgi_clocked.py appends, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.at: dict[str, float] = {}

    def committed(self, run_id: str) -> float | None:
        if run_id not in self.at and self.path.exists():
            with open(self.path) as log:
                log.seek(self._offset)
                for line in log:
                    if line.endswith("\n"):
                        entry = json.loads(line)
                        self.at[entry["run_id"]] = entry["at"]
                self._offset = log.tell()
        return self.at.get(run_id)


def _cancel_loop(
    stack: Stack, worker: Worker, cancel_url: str, label: str, commits: CommitLog | None = None
) -> dict[str, list[float]]:
    """Stops through `cancel_url` while the worker listens wherever its own URL put it."""
    iterations, warmup = stack.n(100, 15), 5
    out: dict[str, list[float]] = {"to_signal": [], "to_drained": [], "commit_to_signal": []}
    with httpx.Client(
        base_url=cancel_url, headers={"Authorization": f"Bearer {stack.reviewer_token}"}
    ) as http:
        for index in range(iterations + warmup):
            run = worker.leased_run(f"{label} #{index}")
            requested = time.monotonic()
            response = http.post(f"/api/v1/runs/{run.pk}/cancel/", json={"reason": "user_stop"})
            if response.status_code != 202:
                raise RuntimeError(f"cancel answered {response.status_code}: {response.text}")
            answer = worker.finished(run.pk)
            if index < warmup:
                continue
            out["to_signal"].append((answer["signal_at"] - requested) * 1000)
            out["to_drained"].append((answer["drained_at"] - requested) * 1000)
            committed = commits.committed(run.pk) if commits is not None else None
            if committed is not None:
                out["commit_to_signal"].append((answer["signal_at"] - committed) * 1000)
    return out


def _commit_here_loop(stack: Stack, worker: Worker) -> list[float]:
    """Stops committed in this process (neither daphne), timed from the commit itself."""
    from bench.bench_stop import _reviewer_actor
    from bench.hooks import CommitClock
    from runs import services
    from runs.models import StopReason

    reviewer = _reviewer_actor(stack)
    iterations, warmup = stack.n(100, 15), 5
    samples: list[float] = []
    clock = CommitClock().install()
    try:
        for index in range(iterations + warmup):
            run = worker.leased_run(f"Commit-clock stop #{index}")
            services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=reviewer)
            committed = clock.committed(run.pk, "stop_signal")
            answer = worker.finished(run.pk)
            if index >= warmup and committed is not None:
                samples.append((answer["signal_at"] - committed) * 1000)
    finally:
        clock.uninstall()
    return samples


def bench_stop(stack: Stack, farm: Farm) -> list[Row]:
    rows: list[Row] = []
    proxy = proxy_for(stack, farm, 2)
    worker = Worker(stack, proxy.base_url, "scale-worker-proxy")
    try:
        through = _cancel_loop(stack, worker, proxy.base_url, "Proxied stop")
    finally:
        worker.close()
        proxy.stop()
    rows += [
        latency_row(
            "scale",
            "stop through nginx (2 daphne): POST /cancel/ → signal at the worker",
            through["to_signal"],
            note=f"load average {os.getloadavg()[0]:.2f}; worker and reviewer both via the proxy",
        ),
        latency_row(
            "scale",
            "  through nginx: POST /cancel/ → worker drained",
            through["to_drained"],
        ),
    ]
    # Daphne A holds the worker's push socket; B takes the stop. Both serve the production app
    # with a commit clock (bench/asgi_clocked.py), so commit → signal is timed from B's commit.
    commit_log = stack.log_dir / "stop-commits.jsonl"
    commit_log.unlink(missing_ok=True)
    pair = start_farm(
        stack,
        [CLOCKED_APP, CLOCKED_APP],
        env={**stack.env, "BENCH_COMMIT_LOG": str(commit_log)},
        label="stop",
    )
    commits = CommitLog(commit_log)
    worker = Worker(stack, pair.url(0), "scale-worker-a")
    try:
        cross = _cancel_loop(stack, worker, pair.url(1), "Cross-process stop", commits)
        same = _cancel_loop(stack, worker, pair.url(0), "Same-process stop", commits)
        third = _commit_here_loop(stack, worker)
    finally:
        worker.close()
        pair.stop()
    load = os.getloadavg()[0]
    rows += [
        latency_row(
            "scale",
            "cross-process stop: commit on daphne B → signal at the worker on daphne A",
            cross["commit_to_signal"],
            target_key="p99",
            target_ms=10,
            note=f"load average {load:.2f}; B's commit stamped in B by bench/asgi_clocked.py; "
            "B → Redis → A → the worker's push socket",
        ),
        latency_row(
            "scale",
            "  cross-process: POST /cancel/ to B → signal at the worker on A",
            cross["to_signal"],
        ),
        latency_row(
            "scale",
            "  same process: commit on A → signal at the worker on A",
            same["commit_to_signal"],
        ),
        latency_row(
            "scale",
            "  same process: POST /cancel/ to A → signal at the worker on A",
            same["to_signal"],
        ),
        latency_row(
            "scale",
            "  commit in a third process (the bench's) → signal at the worker on A",
            third,
            note="the stop committed outside any daphne, as the console's Celery-side stops do",
        ),
    ]
    return rows


# --------------------------------------------------------------------------------------------
# 4. and 5. the fan-out and memory


def _merge_reports(reports: list[dict[str, Any]]) -> dict[str, Any]:
    arrivals: dict[int, list[float]] = {}
    merged: dict[str, Any] = {
        "missed_in_sequence": 0,
        "duplicates": 0,
        "out_of_order": 0,
        "frames": 0,
        "viewers_with_frames": 0,
        "failures": [],
    }
    for report in reports:
        for seq, times in report["arrivals"].items():
            arrivals.setdefault(int(seq), []).extend(times)
        for key in ("missed_in_sequence", "duplicates", "out_of_order", "frames"):
            merged[key] += report[key]
        merged["viewers_with_frames"] += report["viewers_with_frames"]
        merged["failures"] += report["failures"]
    merged["arrivals"] = arrivals
    return merged


def _reset_peak(pid: int) -> bool:
    """Linux `clear_refs` 5 resets VmHWM, so the peak is this measurement's."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _open_sockets(pid: int) -> int:
    try:
        return sum(
            1
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        )
    except OSError:
        return -1


def _viewer_processes(
    stack: Stack, url: str, origin: str, cookies: list[str], viewers: int, label: str
) -> list[LineProcess]:
    per_process = viewers // VIEWER_PROCESSES
    return [
        LineProcess(
            [
                PYTHON,
                str(ROOT / "bench" / "ws_viewers.py"),
                "--url",
                url,
                "--origin",
                origin,
                "--cookies",
                ",".join(cookies),
                "--count",
                str(per_process),
            ],
            stack.env,
            stack.log_dir / f"ws_viewers-{label}-{index}.log",
        )
        for index in range(VIEWER_PROCESSES)
    ]


def fanout(
    stack: Stack, farm: Farm, processes: int, *, viewers: int, rate: float, seconds: float
) -> list[Row]:
    from bench.bench_fanout import USERS, _drive, _sessions
    from bench.hooks import CommitClock
    from runs import services
    from runs.actors import Actor
    from runs.models import Team

    system = Actor.system("bench")
    run_obj = services.run_create(
        team=Team.objects.get(pk=stack.team_id),
        title=f"Watched run ({processes} daphne)",
        agent="research-agent",
        actor=system,
    )
    lease = services.lease_acquire(
        run_id=run_obj.pk, worker_id="researcher-1", ttl_seconds=3600, actor=system
    )
    cookies = _sessions(stack, USERS)
    pids = [daphne.pid for daphne in farm.daphnes[:processes]]
    before = {pid: (rss_kib(pid), _open_sockets(pid)) for pid in pids}
    hwm_reset = all(_reset_peak(pid) for pid in pids)
    proxy = proxy_for(stack, farm, processes)
    clock = CommitClock().install()
    clients = _viewer_processes(
        stack,
        f"ws://127.0.0.1:{proxy.port}/ws/runs/{run_obj.pk}/",
        f"http://127.0.0.1:{proxy.port}",
        cookies,
        viewers,
        f"{processes}p",
    )
    try:
        hellos = [client.receive(timeout=180) for client in clients]
        connected = sum(hello.get("connected", 0) for hello in hellos)
        if connected != viewers:
            raise RuntimeError(f"only {connected} of {viewers} viewers connected: {hellos}")
        time.sleep(1.0)
        open_now = {pid: (rss_kib(pid), _open_sockets(pid)) for pid in pids}
        first_seq = clock.by_seq(run_obj.pk)
        load = os.getloadavg()[0]
        groups = {
            "daphne": pids,
            "nginx": process_tree(proxy.process.pid),
            "viewer clients": [client.process.pid for client in clients],
        }
        cpu_before = {name: cpu_seconds(group) for name, group in groups.items()}
        changes = _drive(stack, run_obj.pk, lease.epoch, rate, seconds)
        for client in clients:
            client.send({"op": "report", "quiet": 1.0, "max_wait": 30})
        report = _merge_reports([client.receive(timeout=180) for client in clients])
        cpu = {name: cpu_seconds(group) - cpu_before[name] for name, group in groups.items()}
        after = {pid: rss_kib(pid) for pid in pids}
    finally:
        clock.uninstall()
        for client in clients:
            client.close()
        proxy.stop()

    commits = {seq: at for seq, at in clock.by_seq(run_obj.pk).items() if seq not in first_seq}
    latencies: list[float] = []
    never_arrived = 0
    for seq, committed in commits.items():
        times = report["arrivals"].get(seq, [])
        never_arrived += viewers - len(times)
        latencies.extend((at - committed) * 1000 for at in times)
    gaps = report["missed_in_sequence"] + never_arrived
    connect_seconds = max(hello["connect_seconds"] for hello in hellos)
    frames = max(report["frames"], 1)
    # What a frame costs each side, whatever the machine's load: capacity = cores / cost.
    per_frame = ", ".join(f"{name} {seconds * 1e6 / frames:.0f}" for name, seconds in cpu.items())
    rows = [
        latency_row(
            "scale",
            f"fan-out: commit → arrival, {viewers:,} viewers via nginx → {processes} daphne "
            f"({changes} changes at {rate:g}/s)",
            latencies,
            target_key="p99",
            target_ms=100,
            note=f"load average {load:.2f}; {report['frames']:,} frames; gaps via seq {gaps} "
            f"(missed in sequence {report['missed_in_sequence']}, never arrived {never_arrived}); "
            f"duplicates {report['duplicates']}, out of order {report['out_of_order']}; "
            f"connected in {connect_seconds:.1f} s by {VIEWER_PROCESSES} client processes; "
            f"CPU µs per delivered frame: {per_frame}; failures {report['failures'][:2]}",
        ),
        Row(
            "scale",
            f"  fan-out gaps ({viewers:,} viewers, {processes} daphne)",
            {"value": gaps},
            "",
            target="0",
            judged=gaps,
            met=gaps == 0,
        ),
    ]
    for number, pid in enumerate(pids, start=1):
        sockets = open_now[pid][1] - before[pid][1]
        peak_mib = after[pid]["VmHWM"] / 1024
        one_process = processes == 1
        rows.append(
            Row(
                "scale",
                f"  daphne #{number} of {processes}: peak RSS, {sockets:,} sockets open",
                {"value": peak_mib},
                "MiB",
                target="≤ 300 MiB" if one_process else "",
                judged=peak_mib if one_process else None,
                met=(peak_mib <= 300) if one_process else None,
                note=f"RSS before viewers {before[pid][0]['VmRSS'] / 1024:.0f} MiB, sockets open "
                f"{open_now[pid][0]['VmRSS'] / 1024:.0f} MiB, after {after[pid]['VmRSS'] / 1024:.0f} MiB"
                + ("" if hwm_reset else "; VmHWM since start"),
            )
        )
    return rows


# --------------------------------------------------------------------------------------------


def _part(name: str, measure: Callable[[], list[Row]]) -> list[Row]:
    """One failed part must not take the others' figures with it."""
    try:
        return measure()
    except Exception as error:
        traceback.print_exc()
        return [
            Row("scale", f"{name}: FAILED", {}, "", note=f"{type(error).__name__}: {error}"[:400])
        ]


def _wait_for_sockets_closed(farm: Farm, baseline: dict[int, int], timeout: float = 60.0) -> None:
    """Until each daphne is back to the sockets it had before a fan-out (the closing viewers'
    consumers have left their groups), so one measurement's teardown is not the next's load."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_open_sockets(pid) <= count + 2 for pid, count in baseline.items()):
            return
        time.sleep(0.5)


def run(stack: Stack) -> list[Row]:
    limit = raise_fd_limit()
    farm = start_farm(stack, [PRODUCTION_APP] * max(PROCESS_COUNTS))
    rows: list[Row] = []
    try:
        from bench.fixtures import analyze

        if "ingest" in PARTS:
            rows += _part("ingestion", lambda: bench_ingest(stack, farm))
        analyze("runs_step", "runs_eventreceipt", "runs_run")
        if "stop" in PARTS:
            rows += _part("stop", lambda: bench_stop(stack, farm))
        viewers = stack.n(VIEWERS, 200)
        seconds = stack.n(20.0, 5.0)
        for processes, rate in FANOUTS if "fanout" in PARTS else ():
            baseline = {daphne.pid: _open_sockets(daphne.pid) for daphne in farm.daphnes}
            rows += _part(
                f"fan-out, {processes} daphne at {rate:g}/s",
                lambda processes=processes, rate=rate: fanout(  # type: ignore[misc]
                    stack, farm, processes, viewers=viewers, rate=rate, seconds=seconds
                ),
            )
            _wait_for_sockets_closed(farm, baseline)
    finally:
        farm.stop()
    if rows:
        rows[0].note += f"; fd limit {limit}"
    return rows
