"""Waiting for another thread without Django: the agent package's tests (tests/agent) use it,
and they import no server code. (`tests.support.stack.wait_until` is the live-stack one, which
raises with what it waited for.)"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    condition: Callable[[], object], timeout: float = 5.0, interval: float = 0.005
) -> bool:
    """True as soon as `condition()` is true; False if it is still false after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
