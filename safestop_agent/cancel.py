"""Cooperative cancellation: one token per run, set by whoever learns of the stop first.

The token is the only thing worker code needs to watch. The push listener, the
heartbeat loop and a refused permit all set the same token, so a stop reaches
the code that is about to start work by the fastest path available.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("safestop_agent")


class Cancelled(Exception):
    """Raised where worker code must not go on because the run was stopped."""

    def __init__(
        self,
        reason: str | None = None,
        *,
        stop_epoch: int | None = None,
        requested_by: str | None = None,
    ) -> None:
        super().__init__(reason or "cancelled")
        self.reason = reason
        self.stop_epoch = stop_epoch
        self.requested_by = requested_by


@dataclass(frozen=True)
class CancelRequest:
    """Who stopped the run, why, and at which epoch (the first request wins)."""

    reason: str
    stop_epoch: int | None = None
    requested_by: str | None = None


class CancelToken:
    """A thread-safe, set-once stop flag that callers can wait on.

    The first `cancel()` is kept: later ones (the same stop arriving by push and
    by heartbeat) are answered False and change nothing, so `reason` always
    names the stop that actually happened first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._request: CancelRequest | None = None
        self._callbacks: list[Callable[[], object]] = []

    def cancel(
        self,
        reason: str = "cancelled",
        stop_epoch: int | None = None,
        requested_by: str | None = None,
    ) -> bool:
        """Record the stop; return True only for the call that actually set the token."""
        with self._lock:
            if self._request is not None:
                return False
            self._request = CancelRequest(reason, stop_epoch, requested_by)
            # Set the event last, inside the lock: a waiter woken by it always sees the request.
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call_quietly(callback)
        return True

    def on_cancel(self, callback: Callable[[], object]) -> Callable[[], None]:
        """Call `callback` once when the token is cancelled (at once if it already is).

        For code that waits on something else as well (an approval, a queue)
        and must wake on a stop too. Returns a function that unregisters it.
        """
        with self._lock:
            if self._request is None:
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        _call_quietly(callback)
        return lambda: None

    def _forget(self, callback: Callable[[], object]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    @property
    def request(self) -> CancelRequest | None:
        return self._request

    @property
    def reason(self) -> str | None:
        return self._request.reason if self._request else None

    @property
    def stop_epoch(self) -> int | None:
        return self._request.stop_epoch if self._request else None

    @property
    def requested_by(self) -> str | None:
        return self._request.requested_by if self._request else None

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep up to `timeout` seconds, waking at once on cancel; True if cancelled."""
        return self._event.wait(timeout)

    def raise_if_cancelled(self) -> None:
        request = self._request
        if request is not None:
            raise Cancelled(
                request.reason,
                stop_epoch=request.stop_epoch,
                requested_by=request.requested_by,
            )

    def __repr__(self) -> str:
        state = f"cancelled reason={self.reason!r}" if self.cancelled else "active"
        return f"<CancelToken {state}>"


def _call_quietly(callback: Callable[[], object]) -> None:
    # The stop itself must be recorded whatever a waiter's wake-up hook does.
    try:
        callback()
    except Exception:
        log.exception("safestop: cancel callback failed")
