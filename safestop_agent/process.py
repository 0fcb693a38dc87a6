"""Run a shell tool so that stopping it stops all of it (seed §2, §6).

`subprocess.run(timeout=...)` kills only the direct child and then waits on the
pipes, which a grandchild may hold open forever. `run_process` instead:

- runs the command under a small supervisor process (`_reaper.py`) that is a
  child subreaper, so descendants that call `setsid()` are still found;
- on cancel or timeout sends SIGTERM to the whole tree, waits `grace_seconds`,
  then SIGKILL -- and reports whether it had to escalate;
- kills descendants that outlive the command, unless told not to;
- reads output with a size bound, and once the command has finished stops
  waiting for EOF after `drain_timeout`: output that was cut short by the bound
  or by abandoning the pipe is reported as `output_truncated`.

A token that is already cancelled raises `Cancelled` before anything starts;
a cancel while running returns a result with `cancelled=True` so the caller can
record what the tool printed before it was stopped.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .cancel import CancelToken

REAPER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")
POLL_SECONDS = 0.02
READ_CHUNK = 65536
# The supervisor needs `grace` plus its own SIGKILL loop (2 s) to finish; past
# that, it is stuck or dead and we kill the process group ourselves.
SUPERVISOR_MARGIN_SECONDS = 3.0


@dataclass(frozen=True)
class ProcessResult:
    """How a command ended, with everything needed to say so honestly."""

    returncode: int | None
    stdout: bytes
    output_truncated: bool
    killed: bool
    escalated_to_kill: bool
    leftover_pids: tuple[int, ...]
    duration: float
    pid: int | None = None
    cancelled: bool = False
    timed_out: bool = False
    output_abandoned: bool = False
    output_bytes_seen: int = 0
    reaped_descendants: tuple[int, ...] = ()
    boundary_note: str | None = None
    start_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.killed

    def summary(self) -> str:
        """One line for an observation: how it ended and what is known about its output."""
        parts = [f"exit={self.returncode}"]
        if self.cancelled:
            parts.append("cancelled")
        if self.timed_out:
            parts.append("timed out")
        if self.escalated_to_kill:
            parts.append("SIGKILL after grace")
        if self.reaped_descendants:
            parts.append(f"killed {len(self.reaped_descendants)} descendant(s)")
        if self.leftover_pids:
            parts.append(f"left running: {list(self.leftover_pids)}")
        if self.output_abandoned:
            parts.append("stopped reading: a descendant kept the output open")
        if self.output_truncated:
            parts.append(
                f"output truncated ({len(self.stdout)} of {self.output_bytes_seen}+ bytes)"
            )
        if self.start_error:
            parts.append(f"could not start: {self.start_error}")
        return ", ".join(parts)


@dataclass
class _BoundedOutput:
    """Keeps the first `limit` bytes and counts the rest, which is read and dropped.

    Reading past the bound matters: a command blocked on a full pipe would
    never finish, turning "too much output" into "hung".
    """

    limit: int
    kept: bytearray = field(default_factory=bytearray)
    seen: int = 0

    def feed(self, data: bytes) -> None:
        self.seen += len(data)
        room = self.limit - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    @property
    def cut(self) -> bool:
        return self.seen > len(self.kept)


class _Pipes:
    """The output pipe and the supervisor's report pipe, read without ever blocking."""

    def __init__(self, output_fd: int, report_fd: int, max_output_bytes: int) -> None:
        self.output = _BoundedOutput(max_output_bytes)
        self.report_lines: list[dict[str, Any]] = []
        self._report_buffer = b""
        self._output_fd = output_fd
        self._selector = selectors.DefaultSelector()
        for fd in (output_fd, report_fd):
            os.set_blocking(fd, False)
            self._selector.register(fd, selectors.EVENT_READ)

    @property
    def open_count(self) -> int:
        return len(self._selector.get_map())

    @property
    def output_open(self) -> bool:
        return self._output_fd in self._selector.get_map()

    def pump(self, timeout: float) -> None:
        for key, _events in self._selector.select(timeout):
            fd = int(key.fd)
            try:
                data = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                continue
            if not data:
                self._close(fd)
            elif fd == self._output_fd:
                self.output.feed(data)
            else:
                self._feed_report(data)

    def report(self, event: str) -> dict[str, Any] | None:
        for line in self.report_lines:
            if line.get("event") == event:
                return line
        return None

    def close_all(self) -> None:
        for key in list(self._selector.get_map().values()):
            self._close(key.fd)
        self._selector.close()

    def _feed_report(self, data: bytes) -> None:
        self._report_buffer += data
        *complete, self._report_buffer = self._report_buffer.split(b"\n")
        for raw in complete:
            if raw.strip():
                self.report_lines.append(json.loads(raw))

    def _close(self, fd: int) -> None:
        self._selector.unregister(fd)
        os.close(fd)


def command_argv(command: str | Sequence[str], shell: bool) -> list[str]:
    if shell:
        if not isinstance(command, str):
            raise TypeError("shell=True takes the command as one string")
        return ["/bin/sh", "-c", command]
    if isinstance(command, str):
        raise TypeError("pass a list of arguments, or shell=True for a shell command string")
    return [str(arg) for arg in command]


def run_process(
    command: str | Sequence[str],
    *,
    token: CancelToken | None = None,
    timeout: float | None = None,
    grace_seconds: float = 2.0,
    max_output_bytes: int = 1_000_000,
    shell: bool = False,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    drain_timeout: float = 0.5,
    kill_descendants: bool = True,
) -> ProcessResult:
    """Run `command` to completion, cancel or timeout; stdout and stderr are merged.

    1. Refuse to start if `token` is already cancelled (a queued tool never starts).
    2. Start the supervisor, which starts the command in a new session.
    3. Read output (bounded) until the supervisor exits; on cancel/timeout send
       it SIGTERM (it runs TERM → grace → KILL over the tree).
    4. After it exits, wait at most `drain_timeout` for EOF, then abandon the pipe.
    """
    if sys.platform == "win32":
        raise OSError("run_process needs POSIX process groups")
    argv = command_argv(command, shell)
    if token is not None:
        token.raise_if_cancelled()
    started = time.monotonic()
    supervisor, pipes = _start_supervisor(
        argv, grace_seconds, kill_descendants, cwd, env, max_output_bytes
    )
    deadline = started + timeout if timeout is not None else None
    stop_cause: str | None = None
    force_killed = False
    try:
        stop_sent_at: float | None = None
        while supervisor.poll() is None:
            now = time.monotonic()
            if stop_sent_at is None:
                stop_cause = _stop_cause(token, deadline, now)
                if stop_cause is not None:
                    supervisor.send_signal(signal.SIGTERM)
                    stop_sent_at = now
            elif now - stop_sent_at > grace_seconds + SUPERVISOR_MARGIN_SECONDS:
                _kill_supervisor_and_group(supervisor, pipes)
                force_killed = True
            pipes.pump(POLL_SECONDS)
        abandoned = _drain(pipes, drain_timeout)
    finally:
        if supervisor.poll() is None:
            # An exception (KeyboardInterrupt, say) in our own loop: never leave the tree behind.
            _stop_supervisor(supervisor, pipes, grace_seconds)
        pipes.close_all()
    return _result(pipes, started, stop_cause, force_killed, abandoned)


def _start_supervisor(
    argv: list[str],
    grace_seconds: float,
    kill_descendants: bool,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    max_output_bytes: int,
) -> tuple[subprocess.Popen[bytes], _Pipes]:
    output_r, output_w = os.pipe()
    report_r, report_w = os.pipe()
    config = {
        "argv": argv,
        "grace_seconds": grace_seconds,
        "out_fd": output_w,
        "report_fd": report_w,
        "parent_pid": os.getpid(),
        "kill_descendants": kill_descendants,
    }
    try:
        supervisor = subprocess.Popen(
            [sys.executable, "-I", "-S", REAPER_PATH, json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(output_w, report_w),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            # Its own session: a Ctrl-C meant for the agent must not kill the
            # supervisor before it has cleaned up (it gets SIGTERM from us instead).
            start_new_session=True,
        )
    except BaseException:
        for fd in (output_r, report_r):
            os.close(fd)
        raise
    finally:
        # Our copies of the write ends must go, or we would never see EOF.
        for fd in (output_w, report_w):
            os.close(fd)
    return supervisor, _Pipes(output_r, report_r, max_output_bytes)


def _stop_cause(token: CancelToken | None, deadline: float | None, now: float) -> str | None:
    if token is not None and token.cancelled:
        return "cancelled"
    if deadline is not None and now >= deadline:
        return "timeout"
    return None


def _drain(pipes: _Pipes, drain_timeout: float) -> bool:
    """Read what is left after the supervisor exited; True if we gave up on the output pipe."""
    drain_deadline = time.monotonic() + drain_timeout
    while pipes.open_count and time.monotonic() < drain_deadline:
        pipes.pump(min(POLL_SECONDS, max(0.0, drain_deadline - time.monotonic())))
    return pipes.output_open


def _kill_supervisor_and_group(supervisor: subprocess.Popen[bytes], pipes: _Pipes) -> None:
    """Last resort when the supervisor does not finish: kill it and the command's group."""
    started = pipes.report("started")
    if started is not None:
        try:
            os.killpg(int(started["pgid"]), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is already gone
    supervisor.kill()
    supervisor.wait()


def _stop_supervisor(
    supervisor: subprocess.Popen[bytes], pipes: _Pipes, grace_seconds: float
) -> None:
    supervisor.send_signal(signal.SIGTERM)
    try:
        supervisor.wait(grace_seconds + SUPERVISOR_MARGIN_SECONDS)
    except subprocess.TimeoutExpired:
        _kill_supervisor_and_group(supervisor, pipes)


def _result(
    pipes: _Pipes, started: float, stop_cause: str | None, force_killed: bool, abandoned: bool
) -> ProcessResult:
    finished = pipes.report("finished") or {}
    begun = pipes.report("started") or {}
    note = finished.get("boundary_note")
    if force_killed or not finished:
        note = "the supervisor did not report; only the command's process group was killed"
    output = pipes.output
    return ProcessResult(
        returncode=finished.get("returncode"),
        stdout=bytes(output.kept),
        output_truncated=output.cut or abandoned,
        killed=bool(finished.get("terminated")) or force_killed,
        escalated_to_kill=bool(finished.get("escalated_to_kill")) or force_killed,
        leftover_pids=tuple(finished.get("leftover_pids") or ()),
        duration=time.monotonic() - started,
        pid=begun.get("pid"),
        cancelled=stop_cause == "cancelled",
        timed_out=stop_cause == "timeout",
        output_abandoned=abandoned,
        output_bytes_seen=output.seen,
        reaped_descendants=tuple(finished.get("reaped_descendants") or ()),
        boundary_note=note,
        start_error=finished.get("start_error"),
    )
