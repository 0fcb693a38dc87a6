"""The Celery app (production / scale-out). Tasks are thin wrappers in `runs.tasks`.

Run with `celery -A console worker` and `celery -A console beat`. Beat drives the same periodic
work the embedded loop does (`runs.dispatch.run_periodic_work`), one task per concern, so a slow
webhook never delays the lease reaper or the drain watchdog.
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
    """Periodic tasks. `expires` drops a tick nobody ran in time instead of piling them up."""
    every = max(float(interval), 0.5)

    def entry(task: str, seconds: float) -> dict[str, object]:
        return {"task": task, "schedule": seconds, "options": {"expires": max(seconds * 4, 5.0)}}

    return {
        "dispatch-pending": entry("runs.tasks.dispatch_pending", every),
        "reap-expired-leases": entry("runs.tasks.reap_expired_leases", every),
        "fence-overdue-stops": entry("runs.tasks.fence_overdue_stops", every),
        "enforce-budgets": entry("runs.tasks.enforce_budgets", max(every, 1.0)),
        "expire-overdue-approvals": entry("runs.tasks.expire_overdue_approvals", max(every, 1.0)),
        "escalate-waiting-approvals": entry(
            "runs.tasks.escalate_waiting_approvals", max(every, 5.0)
        ),
        "reap-stuck-dispatches": entry("runs.tasks.reap_stuck_dispatches", max(every, 5.0)),
        "send-due-notifications": entry(
            "notifications.tasks.send_due_notifications", max(every, 1.0)
        ),
        "policy-tick": entry("policies.tasks.tick", max(every, 1.0)),
        "remind-waiting-handoffs": entry("notifications.tasks.remind_waiting_handoffs", 60.0),
        "verify-ledger": entry(
            "notifications.tasks.verify_ledger", settings.SAFESTOP_LEDGER_VERIFY_SECONDS
        ),
    }


app.conf.beat_schedule = beat_schedule(settings.SAFESTOP_BACKGROUND_INTERVAL)
