"""The shell-tool rows of seed §6: the whole tree ends, and nothing hangs on a held pipe.

Every test reads the pids of the tree it started (the command writes them to a
file) and checks afterwards, via /proc, that none of them is alive.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from safestop_agent import Cancelled, CancelToken, ProcessResult, run_process

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux"), reason="checks the tree through Linux /proc"
    ),
    pytest.mark.slow,  # real process trees
]


def process_alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (dead, only waiting to be reaped)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    state = raw[raw.rfind(")") + 2 :].split()[0]
    return state not in ("Z", "X")


def read_pids(path: str) -> list[int]:
    if not os.path.exists(path):
        return []
    return [int(word) for word in Path(path).read_text().split()]


def run_in_background(
    fn: Callable[[], ProcessResult],
) -> tuple[threading.Thread, list[ProcessResult]]:
    results: list[ProcessResult] = []
    thread = threading.Thread(target=lambda: results.append(fn()), daemon=True)
    thread.start()
    return thread, results


def wait_for_pids(path: Path, count: int, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = read_pids(str(path))
        if len(pids) >= count:
            return pids
        time.sleep(0.01)
    raise AssertionError(f"the command did not write {count} pids to {path}")


def stat_fields(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rfind(")") + 2 :].split()


def parent_of(pid: int) -> int:
    return int(stat_fields(pid)[1])


def session_of(pid: int) -> int:
    return int(stat_fields(pid)[3])


def assert_all_dead(pids: list[int]) -> None:
    alive = [pid for pid in pids if process_alive(pid)]
    for pid in alive:  # never leave a sleeper behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert alive == [], f"still alive: {alive}"


def test_cancel_kills_a_shell_and_its_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    token = CancelToken()
    thread, results = run_in_background(
        lambda: run_process(
            f"echo $$ > {pidfile}; sleep 300 & echo $! >> {pidfile}; wait",
            shell=True,
            token=token,
            grace_seconds=1.0,
        )
    )
    pids = wait_for_pids(pidfile, 2)
    started = time.monotonic()
    token.cancel("user_stop")
    thread.join(5)
    result = results[0]

    assert time.monotonic() - started < 2.0
    assert result.cancelled and result.killed
    assert not result.escalated_to_kill, "sh and sleep both obey SIGTERM"
    assert result.returncode == -signal.SIGTERM
    assert result.leftover_pids == ()
    assert_all_dead(pids)


def test_timeout_reaches_a_grandchild_that_started_its_own_session(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    # The inner sh starts `setsid sleep` and exits at once, so the sleeper is an
    # orphan in another session: killpg cannot reach it, only the subreaper can.
    command = (
        f"echo $$ > {pidfile}; "
        f"sh -c 'setsid sleep 300 & echo $! >> {pidfile}'; "
        f"sleep 300 & echo $! >> {pidfile}; wait"
    )
    token = CancelToken()
    thread, results = run_in_background(
        lambda: run_process(command, shell=True, token=token, grace_seconds=1.0)
    )
    main_pid, escaped_pid, child_pid = wait_for_pids(pidfile, 3)
    supervisor_pid = parent_of(main_pid)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and (
        parent_of(escaped_pid) != supervisor_pid or session_of(escaped_pid) != escaped_pid
    ):
        time.sleep(0.01)  # until setsid() ran, the inner sh exited and the orphan was re-parented
    assert session_of(escaped_pid) == escaped_pid, "the grandchild leads its own session"
    assert session_of(escaped_pid) != session_of(main_pid)
    assert parent_of(escaped_pid) == supervisor_pid, "the subreaper adopted the orphan"

    token.cancel("timeout")
    thread.join(5)
    result = results[0]

    assert result.killed
    assert escaped_pid in result.reaped_descendants
    assert result.leftover_pids == ()
    assert result.boundary_note is None
    assert_all_dead([main_pid, escaped_pid, child_pid])


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = run_process(
        f"trap '' TERM; echo $$ > {pidfile}; sleep 300 & echo $! >> {pidfile}; wait",
        shell=True,
        timeout=0.3,
        grace_seconds=0.4,
    )
    elapsed = time.monotonic() - started

    assert result.timed_out and result.killed
    assert result.escalated_to_kill, "SIGTERM was ignored, so SIGKILL had to follow"
    assert result.returncode == -signal.SIGKILL
    assert 0.7 <= elapsed < 3.0, "TERM at 0.3 s, KILL after the 0.4 s grace"
    pids = read_pids(str(pidfile))
    assert len(pids) == 2
    assert_all_dead(pids)


def test_returns_promptly_while_a_descendant_holds_the_output_open(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = run_process(["sh", "-c", f"(sleep 30) & echo $! > {pidfile}; echo hi"])
    elapsed = time.monotonic() - started

    assert elapsed < 2.0, "must not wait for the sleeper's copy of stdout"
    assert result.returncode == 0
    assert result.stdout == b"hi\n"
    assert not result.killed, "the command itself finished on its own"
    assert result.reaped_descendants, "the sleeper that outlived it was killed and reported"
    assert_all_dead(read_pids(str(pidfile)) + list(result.reaped_descendants))


def test_reading_is_abandoned_and_reported_when_a_descendant_is_left_running(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "pids"
    started = time.monotonic()
    result = run_process(
        ["sh", "-c", f"sleep 30 & echo $! > {pidfile}; echo hi"],
        kill_descendants=False,
        drain_timeout=0.3,
    )
    elapsed = time.monotonic() - started
    (sleeper,) = read_pids(str(pidfile))
    try:
        assert elapsed < 2.0, "drain gives up after drain_timeout instead of waiting 30 s"
        assert result.stdout == b"hi\n"
        assert result.output_abandoned and result.output_truncated
        assert result.leftover_pids == (sleeper,), "what is left running is named, not hidden"
        assert "left running" in result.summary()
    finally:
        if process_alive(sleeper):
            os.kill(sleeper, signal.SIGKILL)
        time.sleep(0.05)
    assert_all_dead([sleeper])


def test_output_is_bounded_and_the_command_never_blocks_on_a_full_pipe() -> None:
    result = run_process("head -c 3000000 /dev/zero", shell=True, max_output_bytes=1000, timeout=10)
    assert result.returncode == 0
    assert len(result.stdout) == 1000
    assert result.output_truncated and not result.output_abandoned
    assert result.output_bytes_seen == 3_000_000


def test_an_already_cancelled_token_never_starts_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    token = CancelToken()
    token.cancel("user_stop")
    with pytest.raises(Cancelled):
        run_process(["touch", str(marker)], token=token)
    time.sleep(0.1)
    assert not marker.exists()


def test_a_missing_program_reports_exit_127_and_why() -> None:
    result = run_process(["/nonexistent/tool", "--help"])
    assert result.returncode == 127
    assert result.start_error
    assert b"/nonexistent/tool" in result.stdout


def test_stderr_is_merged_into_the_output_and_the_exit_code_kept() -> None:
    result = run_process(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert result.returncode == 3
    assert b"out\n" in result.stdout and b"err\n" in result.stdout
    assert not result.killed and not result.output_truncated


def test_a_string_command_without_shell_is_refused() -> None:
    with pytest.raises(TypeError):
        run_process("echo hi")
