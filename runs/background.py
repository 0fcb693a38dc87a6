"""The embedded default's background work: one daemon thread inside the `serve` process.

It calls `runs.dispatch.run_periodic_work` — the same dispatcher, reapers, drain watchdog and
budget enforcer that Celery beat schedules in production — every `interval` seconds, and wakes
early when an outbox item is enqueued or released so dispatch latency is not a whole tick.

It runs in the daphne process on purpose: the in-memory channel layer only reaches browsers
and agents connected to the same process (SETUP pitfall 7). With `REDIS_URL` set, `serve` does
not start it and Celery workers + beat do this work instead (`background_runs_in_process`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections

from runs import notify
from runs.dispatch import TickReport, run_periodic_work

logger = logging.getLogger(__name__)

# Changes after which there may be something to dispatch right away.
WAKE_KINDS = frozenset({"outbox.enqueued", "outbox.released"})


def background_runs_in_process() -> bool:
    """True for the embedded default; False when Celery (REDIS_URL) owns the background work."""
    return not settings.REDIS_URL


class BackgroundLoop:
    """A stoppable daemon thread that runs the periodic work. Exceptions are logged, never fatal."""

    def __init__(self, *, interval: float | None = None, dispatch_limit: int = 100) -> None:
        self.interval = float(
            settings.SAFESTOP_BACKGROUND_INTERVAL if interval is None else interval
        )
        self.dispatch_limit = dispatch_limit
        self.ticks = 0
        self.errors = 0
        self.last_report: TickReport | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="safestop-background", daemon=True)

    # -- control -----------------------------------------------------------------------------

    def start(self) -> BackgroundLoop:
        notify.subscribe(self._on_change)
        self._thread.start()
        logger.info("background loop started (every %.2fs)", self.interval)
        return self

    def stop(self, timeout: float = 10.0) -> bool:
        """Ask the loop to finish its current tick and exit; True if it did within `timeout`."""
        notify.unsubscribe(self._on_change)
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        stopped = not self._thread.is_alive()
        if not stopped:
            logger.warning(
                "background loop still busy after %.1fs; it is a daemon and will not block exit",
                timeout,
            )
        return stopped

    def wake(self) -> None:
        """Run the next tick now instead of at the end of the interval."""
        self._wake.set()

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def wait_for_ticks(self, count: int, timeout: float = 10.0) -> bool:
        """For tests and `serve --check`: block until `count` more ticks have completed."""
        target = self.ticks + count
        deadline = time.monotonic() + timeout
        while self.ticks < target and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.ticks >= target

    # -- the thread --------------------------------------------------------------------------

    def _on_change(self, event: dict[str, Any]) -> None:
        # Called on commit by whichever thread committed; setting an Event is all it does.
        if event.get("kind") in WAKE_KINDS:
            self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                # Cleared before the tick, so a wake-up that arrives during it is not lost.
                self._wake.clear()
                self._tick()
                self._wake.wait(self.interval)
        finally:
            connections.close_all()  # this thread's connections die with it
            logger.info("background loop stopped after %d ticks", self.ticks)

    def _tick(self) -> None:
        close_old_connections()  # a connection broken since the last tick is replaced, not reused
        try:
            # Sends are bounded per tick so the reapers below still run every couple of seconds
            # while a slow receiver has a backlog (the rest goes out on the next ticks).
            report = run_periodic_work(
                dispatch_limit=self.dispatch_limit, dispatch_seconds=max(2.0, self.interval * 2)
            )
            self.last_report = report
            if report.errors:
                self.errors += len(report.errors)
        except Exception:
            self.errors += 1
            logger.exception("background tick failed")
        finally:
            self.ticks += 1


def start_background_thread(interval: float | None = None) -> BackgroundLoop:
    """Start the embedded background loop (called by `manage.py serve` when REDIS_URL is unset).

    Returns the running loop; call `.stop()` on shutdown.
    """
    return BackgroundLoop(interval=interval).start()
