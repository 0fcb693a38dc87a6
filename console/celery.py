"""The Celery app (production / scale-out). Tasks are thin wrappers in `runs.tasks`.

Run with `celery -A console worker` and `celery -A console beat`. Periodic work (the embedded
loop's `runs.dispatch.run_periodic_work`) runs when something needs it: kicked on commit and
woken at the next deadline (`runs.tasks`); beat only runs the slow safety net.
"""

from __future__ import annotations

import os

from celery import Celery
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("safestop")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["runs", "notifications", "policies"])
# Several deployments (or test sessions) may share one Redis: each names its own queue.
app.conf.task_default_queue = os.environ.get("SAFESTOP_CELERY_QUEUE", "safestop")


def beat_schedule(interval: float) -> dict[str, dict[str, object]]:
    """The safety net. Work is woken by what needs it (`runs.tasks`: a kick on commit, a `wake`
    scheduled at the next deadline); these catch what a lost kick or wake missed, at a pace
    that costs next to nothing on an idle server. `interval` is the net's period (at least
    `SAFETY_NET_MIN_SECONDS`). `expires` drops a tick nobody ran in time instead of piling
    them up."""
    every = max(float(interval), SAFETY_NET_MIN_SECONDS)

    def entry(task: str, seconds: float) -> dict[str, object]:
        return {"task": task, "schedule": seconds, "options": {"expires": max(seconds * 4, 5.0)}}

    return {
        # reapers, watchdog, budgets, approvals, relabel and due notifications: one sweep
        "wake": entry("runs.tasks.wake", every),
        # on its own, so a slow webhook never holds the sweep back
        "dispatch-pending": entry("runs.tasks.dispatch_pending", every),
        "remind-waiting-handoffs": entry("notifications.tasks.remind_waiting_handoffs", 60.0),
        "verify-ledger": entry(
            "notifications.tasks.verify_ledger", settings.SAFESTOP_LEDGER_VERIFY_SECONDS
        ),
    }


SAFETY_NET_MIN_SECONDS = 5.0


app.conf.beat_schedule = beat_schedule(settings.SAFESTOP_SAFETY_NET_SECONDS)
