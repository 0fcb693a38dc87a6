"""The test process's own process tree, for tests that must show nothing was left running without
looking at anyone else's processes (another suite may run beside this one, with the same tools).

While the `own_tree` fixture is active, the test process is a child subreaper (Linux
`PR_SET_CHILD_SUBREAPER`): a process whose parent exits is re-parented to the test process instead
of to init, so an orphan the test caused stays in its tree. The fixture gives `descendants()`,
which walks that tree through `/proc/<pid>/task/<tid>/children`. Orphans that die stay zombies of
the test process until the session ends (reaping them could steal the exit status of a child
another fixture waits for).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

PR_SET_CHILD_SUBREAPER = 36


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            found += [
                int(child) for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            ]
        except OSError:
            continue
    return found


def descendants(pid: int | None = None) -> list[int]:
    """Every live descendant of `pid` (default: this process), children first."""
    found: list[int] = []
    pending = children(os.getpid() if pid is None else pid)
    while pending:
        child = pending.pop(0)
        if child not in found:
            found.append(child)
            pending += children(child)
    return found


def _subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(error)}")


@pytest.fixture
def own_tree() -> Iterator[Callable[[], list[int]]]:
    """`descendants` of the test process, which adopts orphans while the test runs."""
    if not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists():
        pytest.fail(
            "/proc/<pid>/task/<tid>/children is missing (a kernel without CONFIG_PROC_CHILDREN)"
        )
    _subreaper(True)
    try:
        yield descendants
    finally:
        _subreaper(False)
