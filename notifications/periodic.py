"""The notifications' share of the periodic work.

The embedded background loop runs `notifications_periodic` every tick (`runs.hooks.on_periodic`);
with Celery, beat schedules the tasks in `notifications.tasks` instead. Sends are bounded per
tick (`SAFESTOP_NOTIFY_TICK_SECONDS`) so a slow target delays the loop's next tick by at most
that plus one transport timeout, and never a stop, a permit or an approval: those run in their
own requests and transactions, which only ever write a row.

The handoff reminder runs once a minute and the ledger verification every
`SAFESTOP_LEDGER_VERIFY_SECONDS` (it reads the whole ledger), counted from this process's start.
"""

from __future__ import annotations

import threading
import time

from django.conf import settings

from notifications.services import (
    deliveries_reap_stuck,
    deliveries_send_due,
    handoffs_remind_waiting,
    ledger_check,
)

HANDOFF_REMINDER_EVERY = 60.0

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
    if _due("handoffs", HANDOFF_REMINDER_EVERY):
        queued += handoffs_remind_waiting()
    if _due("ledger", settings.SAFESTOP_LEDGER_VERIFY_SECONDS):
        ledger_check()
    deliveries_reap_stuck()
    return queued + deliveries_send_due(limit=50, max_seconds=settings.SAFESTOP_NOTIFY_TICK_SECONDS)
