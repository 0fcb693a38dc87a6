"""Celery tasks (production): thin wrappers over `notifications.services`, scheduled by beat
(`console/celery.py`)."""

from __future__ import annotations

from celery import shared_task

from notifications.services import (
    deliveries_reap_stuck,
    deliveries_send_due,
    handoffs_remind_waiting,
    ledger_check,
)


@shared_task(name="notifications.tasks.send_due_notifications", ignore_result=True)
def send_due_notifications() -> int:
    deliveries_reap_stuck()
    return deliveries_send_due(limit=200, max_seconds=20.0)


@shared_task(name="notifications.tasks.remind_waiting_handoffs", ignore_result=True)
def remind_waiting_handoffs() -> int:
    return handoffs_remind_waiting()


@shared_task(name="notifications.tasks.verify_ledger", ignore_result=True)
def verify_ledger() -> bool:
    """True when every chain verifies; a break is delivered as `ledger.broken`."""
    return ledger_check() is None
