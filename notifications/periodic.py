"""The notifications' share of the periodic work.

The embedded background loop runs `notifications_periodic` every tick (`runs.hooks.on_periodic`);
with Celery, beat schedules the tasks in `notifications.tasks` instead. Sends are bounded per
tick (`SAFESTOP_NOTIFY_TICK_SECONDS`) so a slow target delays the loop's next tick by at most
that plus one transport timeout, and never a stop, a permit or an approval: those run in their
own requests and transactions, which only ever write a row.
"""

from __future__ import annotations

from django.conf import settings

from notifications.services import deliveries_reap_stuck, deliveries_send_due


def notifications_periodic() -> int:
    deliveries_reap_stuck()
    return deliveries_send_due(limit=50, max_seconds=settings.SAFESTOP_NOTIFY_TICK_SECONDS)
