"""Dispatch from the process that committed the enqueue (DESIGN §6, §8).

With Celery, an enqueue's dispatch used to wake four processes one after another (the
committing process's kick thread, Redis, the worker's consumer, its pool child) before anyone
claimed the item; on 2 shared cores each wake-up is a scheduling delay. Here the committing
process claims and sends it itself, on one daemon thread per process, woken right after the
commit (never inside the transaction, never in the committing request's thread).

This is sound anywhere because the claim is `dispatch.dispatch_pending`, the same one every
dispatcher runs: it claims through `services.outbox_claim`, under the run lock the stop takes,
so an item is claimed once, by one dispatcher, at its run's current epoch, or not at all (a
frozen item stays frozen). Celery keeps the rest:

- a batch cut short (its item limit, its time bound, an error) is handed to the Celery worker
  through `on_leftover`, as is a wake that finds the thread busy sending (a slow receiver here
  never delays another process's dispatcher, nor the next item by more than today's path);
- the sweep stays the net for a process that dies between its commit and its claim.

At exit the thread claims nothing more and the exit waits (bounded) for the item being sent,
so an item claimed here gets its outcome instead of ending `unknown` at the dispatch deadline.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connections

from runs import dispatch

logger = logging.getLogger(__name__)

Leftover = Callable[[], None]


class LocalDispatcher:
    """One per process: `wake` after a commit that may have left something to dispatch."""

    def __init__(self, *, limit: int = 20, max_seconds: float = 2.0) -> None:
        self.limit = limit
        self.max_seconds = max_seconds
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        # Held while one item is claimed and sent: `close` waits on it, `wake` tests it.
        self._sending = threading.Lock()
        self._closing = False
        self._leftover: Leftover | None = None
        # Items named by their wakes, claimed before the queue is scanned.
        self._items: list[int] = []
        self._thread: tuple[int, threading.Thread] | None = (
            None  # (pid, thread): a fork starts its own
        )
        self.batches = 0

    def wake(self, *, on_leftover: Leftover, item_id: int | None = None) -> None:
        """Dispatch what is claimable now, on this process's thread: `item_id` (the item just
        enqueued) first, by its id, then whatever the queue holds. `on_leftover` hands what
        the thread will not get to soon to another dispatcher (it is called on that thread, or
        here when the thread is busy sending)."""
        with self._lock:
            self._leftover = on_leftover
            if item_id is not None:
                self._items.append(item_id)
        if self._sending.locked():
            on_leftover()
        self._wanted.set()
        self._ensure_thread()

    def close(self, timeout: float | None = None) -> bool:
        """Claim nothing more; wait for the item being sent to be recorded. True if it was (or
        none was in flight) within `timeout`."""
        self._closing = True
        self._wanted.set()
        wait = exit_wait_seconds() if timeout is None else timeout
        if not self._sending.acquire(timeout=wait):
            logger.warning("an outbox item was still being sent at exit; the reaper settles it")
            return False
        self._sending.release()
        return True

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._closing:
                return
            if self._thread is not None and self._thread[0] == os.getpid():
                if self._thread[1].is_alive():
                    return
            thread = threading.Thread(target=self._run, name="safestop-local-dispatch", daemon=True)
            if self._thread is None:
                atexit.register(self.close)
            self._thread = (os.getpid(), thread)
            thread.start()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            # Cleared before the batch, so a commit during it wakes the next one.
            self._wanted.clear()
            if self._closing:
                return
            try:
                drained = self._batch()
            finally:
                connections.close_all()  # this thread's connection goes back to the pool
            if not drained:
                self._hand_over()
            self.batches += 1

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread[1].is_alive()

    def wait_until_stopped(self, timeout: float = 10.0) -> bool:
        """For tests: after `close`, block until the thread has exited."""
        if self._thread is not None:
            self._thread[1].join(timeout)
        return not self.is_alive

    def wait_for_batches(self, count: int, timeout: float = 10.0) -> bool:
        """For tests: block until `count` batches have finished since the start."""
        deadline = time.monotonic() + timeout
        while self.batches < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.batches >= count

    def _batch(self) -> bool:
        """Claim and send the named items, then the queue's, oldest first, until nothing is
        claimable (True), or the limit, the time bound, an error or the exit cut it short
        (False). A named item is claimed through the same `outbox_claim` as the scan's, which
        refuses it if it was claimed elsewhere or frozen meanwhile."""
        deadline = time.monotonic() + self.max_seconds
        with self._lock:
            named, self._items = self._items, []
        for _ in range(self.limit):
            if self._closing or time.monotonic() >= deadline:
                return False
            with self._sending:
                try:
                    if named:
                        dispatch.dispatch_one(named.pop(0))
                    elif dispatch.dispatch_pending(limit=1) == 0:
                        return True
                except Exception:
                    logger.exception("dispatch in the committing process failed")
                    return False
        return False

    def _hand_over(self) -> None:
        with self._lock:
            leftover = self._leftover
        if leftover is None or self._closing:
            return
        try:
            leftover()
        except Exception:
            logger.exception("could not hand the rest of the outbox over; the sweep will")


def exit_wait_seconds() -> float:
    """Long enough for a webhook to connect and answer: what one send may legitimately take."""
    return (
        float(settings.SAFESTOP_WEBHOOK_CONNECT_TIMEOUT)
        + float(settings.SAFESTOP_WEBHOOK_READ_TIMEOUT)
        + 2.0
    )
