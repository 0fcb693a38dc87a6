"""Cooperative cancellation: one token per run, set by whoever learns of the stop first.

The token is the only thing worker code needs to watch. The push listener, the
heartbeat loop and a refused permit all set the same token, so a stop reaches
the code that is about to start work by the fastest path available.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


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
            return True

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
