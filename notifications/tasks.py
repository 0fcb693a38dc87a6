"""Celery tasks (production): thin wrappers over `notifications.services`, scheduled by beat
(`console/celery.py`); and `verify_ledger_soon`, which runs a walk someone asked for outside
their request."""

from __future__ import annotations

from celery import shared_task

from notifications.periodic import walk_ledger_in_thread
from notifications.services import (
    deliveries_reap_stuck,
    deliveries_send_due,
    handoffs_remind_waiting,
    ledger_check,
)
from runs.background import background_runs_in_process


@shared_task(name="notifications.tasks.send_due_notifications", ignore_result=True)
def send_due_notifications() -> int:
    deliveries_reap_stuck()
    return deliveries_send_due(limit=200, max_seconds=20.0)


@shared_task(name="notifications.tasks.remind_waiting_handoffs", ignore_result=True)
def remind_waiting_handoffs() -> int:
    return handoffs_remind_waiting()


@shared_task(name="notifications.tasks.verify_ledger", ignore_result=True)
def verify_ledger(verification_id: int | None = None) -> bool:
    """Walk every chain: the walk `verification_id` someone asked for, else a scheduled one.
    True when no break was found; a break is delivered as `ledger.broken`."""
    return ledger_check(verification_id) is None


def verify_ledger_soon(verification_id: int) -> None:
    """Run a requested walk outside the request that asked for it: a Celery task when Celery
    does the background work (REDIS_URL), else a thread of this process (the embedded default
    has no worker; its background loop must not stall tens of seconds on a walk either)."""
    if background_runs_in_process():
        walk_ledger_in_thread(verification_id)
    else:
        verify_ledger.delay(verification_id)
