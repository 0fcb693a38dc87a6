"""Process-tree supervisor behind `run_process`; runs as its own tiny Python process.

    python -I -S _reaper.py '<json config>'

Why a separate process: `PR_SET_CHILD_SUBREAPER` applies to the whole calling
process, so setting it inside the agent would make the agent inherit every
orphan of every tool it ever ran. The supervisor sets it on itself instead, so
every descendant of the command -- including one that called `setsid()` to
leave the process group and whose parent then exited -- is re-parented to the
supervisor and can be found by walking /proc from the supervisor's pid.

What it does:

1. Sets PR_SET_CHILD_SUBREAPER on itself, and PR_SET_PDEATHSIG so that if the
   agent dies the supervisor is told to stop (and cleans up) rather than
   leaving the tree behind.
2. Starts the command in a new session (its own process group), with stdout
   and stderr on the output pipe it was handed and stdin on /dev/null.
3. Waits for the command to exit, reaping re-parented orphans meanwhile.
4. On SIGTERM/SIGINT/SIGHUP (the parent's "stop"): SIGTERM to the group and to
   every descendant outside it, wait `grace` seconds, then SIGKILL whatever is
   left, repeatedly, until nothing of the tree is alive.
5. When the command exits by itself, does the same to descendants that outlived
   it (unless told to leave them), so a tool call never leaves work running.
6. Writes JSON lines on the report pipe: `started` (pid), then `finished`
   (returncode, whether it terminated or escalated, which pids it reaped, which
   it could not kill).

Standard library only, and no imports from the package: it is run by path with
`-I -S`, so it works whatever the agent's sys.path is.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_SECONDS = 0.01
# After SIGKILL the kernel needs a moment; a tree that keeps forking gets this long.
KILL_LOOP_SECONDS = 2.0


def prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def read_process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) for every process visible in /proc."""
    table: dict[int, tuple[int, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat_file:
                raw = stat_file.read().decode("ascii", "replace")
        except OSError:
            continue  # exited while we were looking
        # The command name may contain spaces and ")": split after the last one.
        fields = raw[raw.rfind(")") + 2 :].split()
        if len(fields) >= 2:
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


def living_descendants(root: int) -> list[int]:
    """Descendants of `root` that are not zombies (zombies are dead, they only need reaping)."""
    table = read_process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    frontier = list(children.get(root, []))
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(children.get(pid, []))
    return sorted(pid for pid in found if table.get(pid, (0, "Z"))[1] not in ("Z", "X"))


def send(pid: int, sig: int, *, group: bool = False) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # already gone, or not ours to kill: the next scan reports it


class Supervisor:
    def __init__(self, config: dict[str, Any]) -> None:
        self.argv: list[str] = config["argv"]
        self.grace = float(config["grace_seconds"])
        self.out_fd = int(config["out_fd"])
        self.report_fd = int(config["report_fd"])
        self.parent_pid = int(config["parent_pid"])
        self.kill_descendants = bool(config["kill_descendants"])
        self.me = os.getpid()
        self.has_proc = os.path.isdir("/proc/self")
        self.stop_requested = False
        self.subreaper = False
        self.main_pid = 0
        self.main_status: int | None = None
        self.signalled: set[int] = set()
        self.escalated = False

    # -- signals from the parent -------------------------------------------------

    def install_stop_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._request_stop)

    def _request_stop(self, signum: int, frame: object) -> None:
        self.stop_requested = True

    # -- the run -----------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.install_stop_handlers()
        self.subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1)
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != self.parent_pid:
            self.stop_requested = True  # the agent died before the death signal was armed
        if self.stop_requested:
            return self.finished(start_error="stopped before start")
        try:
            child = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=self.out_fd,
                stderr=self.out_fd,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as error:
            os.write(self.out_fd, f"{self.argv[0]}: {error.strerror or error}\n".encode())
            return self.finished(start_error=str(error), returncode=127)
        finally:
            # Only the command's tree may hold the output pipe open from now on.
            os.close(self.out_fd)
        self.main_pid = child.pid
        self.report(
            {"event": "started", "pid": child.pid, "pgid": child.pid, "subreaper": self.subreaper}
        )
        terminated = self.wait_for_command()
        child.returncode = self.returncode()  # we reaped it ourselves; keep Popen quiet
        leftovers = self.settle_descendants()
        return self.finished(terminated=terminated, leftover_pids=leftovers)

    def wait_for_command(self) -> bool:
        """Wait for the command to exit or a stop; True if we had to terminate it."""
        while self.main_status is None and not self.stop_requested:
            self.reap()
            if self.main_status is None:
                time.sleep(POLL_SECONDS)
        if self.main_status is not None:
            return False
        self.terminate_tree()
        self.collect_main_status()
        return True

    def collect_main_status(self) -> None:
        # The tree can read as "not alive" while the command is a zombie we have
        # not reaped yet; its exit status is still owed to the report.
        deadline = time.monotonic() + KILL_LOOP_SECONDS
        while self.main_status is None and time.monotonic() < deadline:
            self.reap()
            if self.main_status is None:
                time.sleep(POLL_SECONDS)

    def settle_descendants(self) -> list[int]:
        """Deal with what outlived the command; return pids still alive afterwards."""
        remaining = self.descendants()
        if remaining and (self.kill_descendants or self.stop_requested):
            self.terminate_tree()
            remaining = self.descendants()
        return remaining

    def terminate_tree(self) -> None:
        """SIGTERM the whole tree, wait `grace`, then SIGKILL until nothing is left."""
        self.signal_tree(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            self.reap()
            if not self.tree_alive():
                return
            time.sleep(POLL_SECONDS)
        self.escalated = True
        deadline = time.monotonic() + KILL_LOOP_SECONDS
        while True:
            self.signal_tree(signal.SIGKILL)
            time.sleep(POLL_SECONDS)
            self.reap()
            if not self.tree_alive() or time.monotonic() > deadline:
                return

    def signal_tree(self, sig: int) -> None:
        # Scan first so the report names every process we signalled; then the
        # group (it also reaches members forked after the scan); then each
        # scanned descendant, which covers those that left the group.
        targets = self.descendants()
        self.signalled.update(targets)
        send(self.main_pid, sig, group=True)
        for pid in targets:
            send(pid, sig)

    def tree_alive(self) -> bool:
        if self.has_proc:
            return bool(self.descendants())
        try:
            os.killpg(self.main_pid, 0)
        except (ProcessLookupError, PermissionError):
            return self.main_status is None
        return True

    def descendants(self) -> list[int]:
        return living_descendants(self.me) if self.has_proc else []

    def reap(self) -> None:
        """Collect every exited child, including orphans re-parented to us."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.main_pid:
                self.main_status = status

    def returncode(self) -> int | None:
        if self.main_status is None:
            return None
        return os.waitstatus_to_exitcode(self.main_status)

    # -- reporting ---------------------------------------------------------------

    def boundary_note(self) -> str | None:
        if not self.has_proc:
            return (
                "no /proc: only the command's process group was tracked; descendants "
                "that started their own session are outside the boundary"
            )
        if not self.subreaper:
            return (
                "PR_SET_CHILD_SUBREAPER unavailable: orphaned descendants that left the "
                "process group were re-parented outside the boundary and not tracked"
            )
        return None

    def finished(
        self,
        *,
        terminated: bool = False,
        leftover_pids: list[int] | None = None,
        start_error: str | None = None,
        returncode: int | None = None,
    ) -> dict[str, Any]:
        report = {
            "event": "finished",
            "pid": self.main_pid or None,
            "returncode": returncode if start_error else self.returncode(),
            "terminated": terminated,
            "escalated_to_kill": self.escalated,
            "reaped_descendants": sorted(self.signalled - {self.main_pid}),
            "leftover_pids": leftover_pids or [],
            "subreaper": self.subreaper,
            "boundary_note": self.boundary_note(),
            "start_error": start_error,
        }
        self.report(report)
        return report

    def report(self, message: dict[str, Any]) -> None:
        try:
            os.write(self.report_fd, (json.dumps(message) + "\n").encode())
        except OSError:
            pass  # the agent is gone; the cleanup itself already happened


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    Supervisor(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
