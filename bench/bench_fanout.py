"""Fan-out: 200 browser viewers of one busy run, and the web process's memory meanwhile.

1. 200 sessions' worth of viewers (50 users × 4 tabs, real Django sessions) open the run
   page's websocket `/ws/runs/<id>/` on daphne, with their cookie and an Origin header
   (bench/ws_viewers.py, one asyncio process);
2. this process makes the run busy: `--rate` changes a second for `--seconds` through the
   services (step started / completed, a tool permit and its result, an artifact), each its own
   commit; a `runs.notify` listener ahead of the Channels publisher stamps each commit with its
   `seq`; the frames go Redis → daphne → 200 sockets;
3. latency = arrival at a viewer − commit of that seq, for every (viewer, seq); gaps = seqs a
   viewer never got between its first and last, plus committed seqs after its first that it never
   got; peak RSS of daphne from /proc (VmHWM), sampled RSS alongside.
"""

from __future__ import annotations

import threading
import time

from bench.common import PYTHON, ROOT, Row, latency_row, rss_kib
from bench.hooks import CommitClock
from bench.stack import LineProcess, Stack

VIEWERS = 200
USERS = 50


def _sessions(stack: Stack, users: int) -> list[str]:
    """Logged-in sessions, made the way Django's login makes them."""
    from django.conf import settings
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore

    from runs.models import Membership, Role, Team

    team = Team.objects.get(pk=stack.team_id)
    model = get_user_model()
    cookies = []
    for index in range(users):
        user, created = model.objects.get_or_create(username=f"viewer-{index:03d}")
        if created:
            Membership.objects.create(user=user, team=team, role=Role.VIEWER)
        session = SessionStore()
        session[SESSION_KEY] = str(user.pk)
        # Viewers sign in through the organisation's IdP: the backend such a sign-in records
        # (a session naming a backend that is not configured logs nobody in).
        session[BACKEND_SESSION_KEY] = "accounts.oidc.OIDCBackend"
        session[HASH_SESSION_KEY] = user.get_session_auth_hash()
        session.create()
        cookies.append(f"{settings.SESSION_COOKIE_NAME}={session.session_key}")
    return cookies


class RssSampler:
    def __init__(self, pid: int, every: float = 0.25) -> None:
        self.pid = pid
        self.every = every
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.samples.append(rss_kib(self.pid)["VmRSS"])
            except (OSError, KeyError):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)


def _drive(stack: Stack, run_id: str, epoch: int, rate: float, seconds: float) -> int:
    """Commit `rate` changes a second to the run, each a different kind of real change."""
    from runs import services
    from runs.actors import Actor

    agent = Actor("api_client", "1", "bench-agent")
    interval = 1.0 / rate
    started = time.monotonic()
    changes = 0
    step = 0
    while time.monotonic() - started < seconds:
        target = started + changes * interval
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        kind = changes % 5
        if kind == 0:
            step += 1
            services.events_ingest(
                run_id=run_id,
                epoch=epoch,
                actor=agent,
                events=[
                    {
                        "event_id": f"start-{step}",
                        "type": "step.started",
                        "key": f"page-{step}",
                        "name": f"Read page {step}",
                    }
                ],
            )
        elif kind == 1:
            services.permit_request(
                run_id=run_id,
                epoch=epoch,
                tool_call_id=f"call-{step}",
                tool="fetch_page",
                actor=agent,
                arguments={"page": step},
                step_key=f"page-{step}",
            )
        elif kind == 2:
            services.tool_result_report(
                run_id=run_id,
                tool_call_id=f"call-{step}",
                execution_state="succeeded",
                actor=agent,
                observation=f"page {step}: 2,311 words",
            )
        elif kind == 3:
            services.events_ingest(
                run_id=run_id,
                epoch=epoch,
                actor=agent,
                events=[
                    {
                        "event_id": f"art-{step}",
                        "type": "artifact.added",
                        "name": f"page-{step}.txt",
                        "step_key": f"page-{step}",
                    }
                ],
            )
        else:
            services.events_ingest(
                run_id=run_id,
                epoch=epoch,
                actor=agent,
                events=[
                    {"event_id": f"done-{step}", "type": "step.completed", "key": f"page-{step}"}
                ],
            )
        changes += 1
    return changes


def run(
    stack: Stack, *, viewers: int | None = None, rate: float = 25.0, seconds: float | None = None
) -> list[Row]:
    from runs import services
    from runs.actors import Actor
    from runs.models import Team

    viewers = viewers or stack.n(VIEWERS, 50)
    seconds = seconds or stack.n(20.0, 5.0)
    system = Actor.system("bench")
    team = Team.objects.get(pk=stack.team_id)
    run_obj = services.run_create(
        team=team, title="Busy research run", agent="research-agent", actor=system
    )
    lease = services.lease_acquire(
        run_id=run_obj.pk, worker_id="researcher-1", ttl_seconds=3600, actor=system
    )
    cookies = _sessions(stack, min(USERS, viewers))
    # Reset the process's peak-RSS mark (Linux `clear_refs` 5), so VmHWM is this run's peak,
    # not the ingestion bench's that ran in the same daphne earlier.
    try:
        with open(f"/proc/{stack.daphne.pid}/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        hwm_reset = True
    except OSError:
        hwm_reset = False
    rss_before = rss_kib(stack.daphne.pid)

    clock = CommitClock().install()
    viewer_process = LineProcess(
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
        stack.log_dir / "ws_viewers.log",
    )
    try:
        with RssSampler(stack.daphne.pid) as sampler:
            hello = viewer_process.receive(timeout=120)
            if hello.get("connected") != viewers:
                raise RuntimeError(
                    f"only {hello.get('connected')} of {viewers} viewers connected: {hello}"
                )
            rss_connected = rss_kib(stack.daphne.pid)
            time.sleep(0.5)
            first_seq = clock.by_seq(run_obj.pk)
            changes = _drive(stack, run_obj.pk, lease.epoch, rate, seconds)
            viewer_process.send({"op": "report", "quiet": 1.0, "max_wait": 30})
            report = viewer_process.receive(timeout=120)
        rss_after = rss_kib(stack.daphne.pid)
    finally:
        clock.uninstall()
        viewer_process.close()

    commits = {seq: at for seq, at in clock.by_seq(run_obj.pk).items() if seq not in first_seq}
    arrivals: dict[int, list[float]] = {
        int(seq): times for seq, times in report["arrivals"].items()
    }
    latencies: list[float] = []
    slowest_viewer: list[float] = []
    never_arrived = 0
    short: dict[int, int] = {}
    for seq, committed in commits.items():
        times = arrivals.get(seq, [])
        never_arrived += viewers - len(times)
        if len(times) < viewers:
            short[seq] = viewers - len(times)
        latencies.extend((at - committed) * 1000 for at in times)
        if times:
            slowest_viewer.append((max(times) - committed) * 1000)
    gaps = report["missed_in_sequence"] + never_arrived
    peak = max(rss_after.get("VmHWM", 0), *(sampler.samples or [0]))
    offered = changes * viewers / seconds
    return [
        latency_row(
            "fanout",
            f"commit → arrival, {viewers} viewers of one run ({changes} changes at {rate:g}/s)",
            latencies,
            target_key="p99",
            target_ms=150,
            note=f"{report['frames']:,} frames (offered {offered:,.0f}/s); gaps detected via seq: {gaps} "
            f"(missed in sequence {report['missed_in_sequence']}, never arrived {never_arrived}); "
            f"duplicates {report['duplicates']}, out of order {report['out_of_order']}; "
            f"viewers connected in {hello['connect_seconds']:.1f} s; "
            f"{report['viewers_with_frames']} viewers got frames; failures {report['failures'][:2]}"
            + (
                f"; seqs short of viewers (seq: missing) {dict(list(sorted(short.items()))[:5])}"
                if short
                else ""
            ),
        ),
        latency_row(
            "fanout", "  commit → the last of the viewers has it (per change)", slowest_viewer
        ),
        Row(
            "fanout",
            "gaps detected via seq",
            {"value": gaps},
            "",
            target="0",
            judged=gaps,
            met=gaps == 0,
        ),
        Row(
            "memory",
            "daphne peak RSS during the fan-out",
            {"value": peak / 1024},
            "MiB",
            note=f"RSS before viewers {rss_before['VmRSS'] / 1024:.0f} MiB, with {viewers} sockets open "
            f"{rss_connected['VmRSS'] / 1024:.0f} MiB, after {rss_after['VmRSS'] / 1024:.0f} MiB; "
            f"VmHWM {rss_after['VmHWM'] / 1024:.0f} MiB"
            + ("" if hwm_reset else " (since daphne started)"),
        ),
    ]
