"""Celery tasks (production): thin wrappers over `notifications.services`, scheduled by beat
(`console/celery.py`)."""

from __future__ import annotations

from celery import shared_task

from notifications.services import deliveries_reap_stuck, deliveries_send_due


@shared_task(name="notifications.tasks.send_due_notifications", ignore_result=True)
def send_due_notifications() -> int:
    deliveries_reap_stuck()
    return deliveries_send_due(limit=200, max_seconds=20.0)
