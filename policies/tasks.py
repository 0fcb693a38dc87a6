"""Celery tasks (production): the periodic tick, and a long test against history."""

from __future__ import annotations

from celery import shared_task

from policies.periodic import policies_tick


@shared_task(name="policies.tasks.tick", ignore_result=True)
def tick() -> int:
    return policies_tick()


@shared_task(name="policies.tasks.history_test", ignore_result=True)
def history_test_task(test_id: int) -> None:
    from policies.services import policy_test_run

    policy_test_run(test_id)
