"""Seed 001 §6, rows 4-7: a shell tool is stopped as a whole process tree.

A worker leases a run on the live server and runs a shell tool through `run_process` inside
`run.tool_call(...)`; a reviewer stops the run over HTTP; the stop reaches the worker by push.
The tests then read the process table (/proc, `os.kill(pid, 0)`) and the server's execution
record, ledger and stop packet.
"""

from __future__ import annotations

import os
import random
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from handoff.models import StopPacket
from runs.models import ExecutionRecord, ExecutionState, RunStatus, SideEffectState
from safestop_agent import AgentRun, ProcessResult, run_process
from tests.support.stack import (
    WorkerThread,
    alive,
    leased,
    planned,
    read_pids,
    wait_status,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def marker() -> str:
    """A sleep duration no other process on the machine uses: how we find our tree in /proc."""
    return f"{random.randint(3000, 8999)}.{random.randint(1000, 9999)}"


def processes_with(mark: str) -> list[int]:
    """Live pids whose command line contains `mark`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = (
                Path(f"/proc/{entry}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        if mark in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


def sleepers(mark: str) -> list[int]:
    """Live `sleep <mark>` processes (not the shells or the supervisor that mention the mark)."""
    found = []
    for pid in processes_with(mark):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", mark.encode()]:
            found.append(pid)
    return found


def session_of(pid: int) -> int:
    """The session id (field 6 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[3])


@dataclass
class ShellTool:
    """One leased run whose single tool call is a shell command."""

    stack: Any
    command: str
    side_effect: str = "none"
    grace: float = 1.0
    kill_descendants: bool = True
    drain_timeout: float = 0.5
    run_id: str = ""
    results: list[ProcessResult] = field(default_factory=list)
    runs: list[AgentRun] = field(default_factory=list)
    returned_at: float = 0.0
    worker: WorkerThread | None = None

    def start(self) -> ShellTool:
        client = self.stack.agent()
        self.run_id = client.create_run(
            "Shell tool", "fault-bot", steps=planned(("shell", "tool_read"))
        )["id"]

        def work() -> None:
            with leased(client, self.run_id, into=self.runs) as run:
                with run.step("shell", "Run the shell tool", kind="tool_read"):
                    with run.tool_call(
                        "shell",
                        {"cmd": self.command},
                        side_effect=self.side_effect,  # type: ignore[arg-type]
                        tool_call_id="call_shell",
                        operation_id="shell-op-1",
                        recovery_policy="query_original",
                    ) as call:
                        result = run_process(
                            self.command,
                            shell=True,
                            token=run.token,
                            timeout=60,
                            grace_seconds=self.grace,
                            kill_descendants=self.kill_descendants,
                            drain_timeout=self.drain_timeout,
                        )
                        self.returned_at = time.monotonic()
                        self.results.append(result)
                        call.observe_process(result)
                run.token.raise_if_cancelled()
                run.complete({"shell": "done"})

        self.worker = WorkerThread(work)
        self.worker.start()
        return self

    def stop(self) -> float:
        """Stop the run like a reviewer would; returns when the stop was sent."""
        sent = time.monotonic()
        self.stack.reviewer().cancel(self.run_id, "user_stop", note="stop the shell tool")
        return sent

    def finish(self, timeout: float = 20.0) -> ProcessResult:
        assert self.worker is not None
        self.worker.outcome(timeout)
        return self.results[0]

    def record(self) -> ExecutionRecord:
        return ExecutionRecord.objects.get(run_id=self.run_id, tool_call_id="call_shell")


def test_shell_spawning_long_running_children_leaves_no_process_behind(stack, tmp_path):
    """Row 4 (shell 派生长时间运行的子进程): all work within the managed scope has exited."""
    mark, pids = marker(), tmp_path / "pids"
    command = (
        f"sleep {mark} & echo $! >> {pids}; "
        f"sleep {mark} & echo $! >> {pids}; "
        f"(sleep {mark}; echo never) & echo $! >> {pids}; "  # a subshell with its own child
        f"echo $$ >> {pids}; wait"
    )
    tool = ShellTool(stack, command).start()
    listed = read_pids(str(pids), 4)
    wait_until(lambda: len(sleepers(mark)) >= 3, what="three sleepers")
    before = set(processes_with(mark)) | set(listed)
    assert len(before) >= 5  # supervisor, shell, subshell and three sleepers (minus any overlap)
    assert all(alive(pid) for pid in listed)

    tool.stop()
    result = tool.finish()

    assert result.cancelled and result.killed and result.leftover_pids == ()
    assert not [pid for pid in before if alive(pid)], "a process of the tool survived the stop"
    assert processes_with(mark) == []
    assert set(result.reaped_descendants) >= set(listed) - {result.pid}
    wait_status(tool.run_id, RunStatus.STOPPED_CLEANLY)
    record = tool.record()
    assert record.execution_state == ExecutionState.FAILED  # a read tool that was stopped
    assert "cancelled" in record.last_observation and "descendant" in record.last_observation


def test_descendant_in_its_own_session_is_found_and_killed(stack, tmp_path):
    """Row 5 (后代建立独立会话): found and killed, or the boundary is reported."""
    mark, pids = marker(), tmp_path / "pids"
    escape = tmp_path / "escape.py"
    escape.write_text(
        textwrap.dedent(f"""
        import os, time
        if os.fork() == 0:
            os.setsid()  # its own session and process group: outside the tool's group
            with open({str(pids)!r}, "a") as handle:
                handle.write(f"{{os.getpid()}}\\n")
            time.sleep({mark})
            os._exit(0)
        os._exit(0)  # the parent exits at once: the grandchild is an orphan
    """)
    )
    shell_pid = tmp_path / "shell_pid"
    command = f"{sys.executable} {escape}; echo $$ >> {shell_pid}; sleep {mark}"
    tool = ShellTool(stack, command).start()
    escaped, shell = read_pids(str(pids), 1)[0], read_pids(str(shell_pid), 1)[0]
    wait_until(
        lambda: alive(escaped) and session_of(escaped) == escaped, what="the setsid descendant"
    )
    assert session_of(escaped) != session_of(shell)  # it really left the tool's session

    tool.stop()
    result = tool.finish()

    assert not alive(escaped), "the descendant that called setsid survived the stop"
    assert not alive(shell)
    assert escaped in result.reaped_descendants
    assert result.boundary_note is None  # on Linux the subreaper keeps it inside the boundary
    assert result.leftover_pids == () and processes_with(mark) == []
    wait_status(tool.run_id, RunStatus.STOPPED_CLEANLY)
    assert "killed" in tool.record().last_observation


def test_descendant_holding_the_output_pipe_does_not_block_reading_and_truncation_is_recorded(
    stack, tmp_path
):
    """Row 6 (主进程退出，后代保持输出管道): reading never waits forever; truncation is kept."""
    mark, pids = marker(), tmp_path / "pids"
    # The command exits at once; a background descendant keeps stdout open for a long time.
    # `kill_descendants=False` leaves it running, so nothing closes the pipe for us.
    command = f"echo report line 1; (sleep {mark}; echo too late) & echo $! >> {pids}; exit 0"
    tool = ShellTool(stack, command, kill_descendants=False, drain_timeout=0.5).start()
    holder = read_pids(str(pids), 1)[0]
    started = time.monotonic()
    result = tool.finish(timeout=15)
    try:
        took = tool.returned_at - started
        assert took < 5, f"run_process waited {took:.1f}s on a pipe a descendant held"
        assert result.returncode == 0 and not result.killed
        assert result.output_abandoned and result.output_truncated
        assert b"report line 1" in result.stdout and b"too late" not in result.stdout
        assert holder in result.leftover_pids and alive(holder)  # reported, not hidden
        run = wait_status(tool.run_id, RunStatus.COMPLETED)
        record = tool.record()
        assert record.execution_state == ExecutionState.SUCCEEDED
        assert record.output_truncated is True
        assert "report line 1" in record.last_observation
        assert "a descendant kept the output open" in record.last_observation
        assert run.result == {"shell": "done"}
    finally:
        for pid in processes_with(mark):
            os.kill(pid, 9)
    wait_until(lambda: not processes_with(mark), what="the leftover to die")


def test_tool_ignoring_sigterm_is_killed_after_the_grace_period_and_its_state_confirmed(
    stack, tmp_path
):
    """Row 7 (工具忽略优雅退出请求): escalate after the grace period; confirm the real state."""
    mark, pids = marker(), tmp_path / "pids"
    # `trap '' TERM` is inherited by sleep: the whole tool ignores SIGTERM.
    command = f"trap '' TERM; echo $$ >> {pids}; echo applying migration; sleep {mark}"
    tool = ShellTool(stack, command, side_effect="write", grace=1.0).start()
    shell = read_pids(str(pids), 1)[0]
    wait_until(lambda: sleepers(mark), what="the sleeper")
    sleeper = sleepers(mark)[0]
    ignored = int(Path(f"/proc/{sleeper}/status").read_text().split("SigIgn:")[1].split()[0], 16)
    assert ignored & (1 << (15 - 1)), "the tool does not actually ignore SIGTERM"

    stop_sent = tool.stop()
    result = tool.finish()

    took = tool.returned_at - stop_sent
    print(f"\nSIGTERM ignored; SIGKILL after the 1.0 s grace; tool gone {took:.2f}s after the stop")
    assert result.escalated_to_kill and result.killed and result.cancelled
    assert 1.0 <= took < 5.0
    assert not alive(shell) and not alive(sleeper) and processes_with(mark) == []
    # The process is confirmed dead, but what the migration did is not known: `unknown`, and
    # the stop is dirty until a human confirms it.
    run = wait_status(tool.run_id, RunStatus.STOPPED_DIRTY)
    record = tool.record()
    assert record.execution_state == ExecutionState.UNKNOWN
    assert record.side_effect_state == SideEffectState.PENDING_VERIFICATION
    assert "SIGKILL after grace" in record.last_observation
    packet = StopPacket.objects.get(run_id=tool.run_id, stop_epoch=run.stop_epoch).snapshot
    assert [u["tool_call_id"] for u in packet["unconfirmed_side_effects"]] == ["call_shell"]
    assert (
        packet["unconfirmed_side_effects"][0]["recovery_action"]
        == "query shell-op-1; do not re-run shell"
    )
    assert packet["dirty_reasons"] == ["unconfirmed_side_effects"]

    # a reviewer checks and resolves it: the stop becomes clean
    stack.reviewer().resolve(
        tool.run_id,
        target="tool_call",
        id="call_shell",
        decision="not_applied",
        evidence="migration table shows 0042 not applied",
    )
    wait_status(tool.run_id, RunStatus.STOPPED_CLEANLY)
