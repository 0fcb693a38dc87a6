"""Celery tasks (production): the periodic tick, and a long test against history."""

from __future__ import annotations

from celery import shared_task

from policies.periodic import policies_tick


@shared_task(name="policies.tasks.tick", ignore_result=True)
def tick() -> int:
    return policies_tick()
