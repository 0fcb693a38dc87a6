"""The notifications' share of the periodic work.

The embedded background loop runs `notifications_periodic` every tick (`runs.hooks.on_periodic`);
with Celery, beat schedules the tasks in `notifications.tasks` instead. Sends are bounded per
tick (`SAFESTOP_NOTIFY_TICK_SECONDS`) so a slow target delays the loop's next tick by at most
that plus one transport timeout, and never a stop, a permit or an approval: those run in their
own requests and transactions, which only ever write a row.

The handoff reminder runs once a minute and the ledger verification every
`SAFESTOP_LEDGER_VERIFY_SECONDS` (it reads the whole ledger), counted from this process's start;
the walk runs in a thread of its own, so a big ledger does not hold up the loop's next ticks.
A clean walk also writes the next anchor of the chains' heads outside the database
(`runs.ledger_checks.verification_run`), so the interval bounds what a database writer can cut
from the end of a chain unnoticed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connections

from notifications.services import (
    deliveries_reap_stuck,
    deliveries_send_due,
    handoffs_remind_waiting,
    ledger_check,
)
from runs.background import background_runs_in_process

HANDOFF_REMINDER_EVERY = 60.0

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_last = {"handoffs": time.monotonic(), "ledger": time.monotonic()}


def _due(name: str, every: float) -> bool:
    with _lock:
        now = time.monotonic()
        if now - _last[name] < every:
            return False
        _last[name] = now
        return True


def notifications_periodic() -> int:
    queued = 0
    # With Celery, beat schedules the reminder and the walk as tasks of their own; this step
    # also runs in a worker's wake (`runs.tasks.wake`) and sends due deliveries only.
    if background_runs_in_process():
        if _due("handoffs", HANDOFF_REMINDER_EVERY):
            queued += handoffs_remind_waiting()
        if _due("ledger", settings.SAFESTOP_LEDGER_VERIFY_SECONDS):
            walk_ledger_aside()
    deliveries_reap_stuck()
    return queued + deliveries_send_due(limit=50, max_seconds=settings.SAFESTOP_NOTIFY_TICK_SECONDS)


_walking = threading.Lock()


def walk_ledger_aside() -> bool:
    """Start the scheduled walk of every hash chain in a thread, unless one is still walking.
    A walk reads the whole ledger (22–25 s at a million entries, docs/BENCHMARKS.md): inline,
    it held the embedded loop's dispatch, reapers and drain watchdog for that long."""
    if not _walking.acquire(blocking=False):
        return False
    walk_ledger_in_thread(None, then=_walking.release)
    return True


def walk_ledger_in_thread(
    verification_id: int | None, *, then: Callable[[], None] | None = None
) -> None:
    """`ledger_check(verification_id)` in a daemon thread of this process (the embedded
    default has no worker to hand it to), then `then`."""
    threading.Thread(
        target=_walk, args=(verification_id, then), name="ledger-walk", daemon=True
    ).start()


def _walk(verification_id: int | None, then: Callable[[], None] | None) -> None:
    try:
        ledger_check(verification_id)
    except Exception:  # a thread's exception would vanish: log it (the walk records it failed)
        logger.exception("ledger verification %s failed", verification_id or "(scheduled)")
    finally:
        connections.close_all()
        if then is not None:
            then()
