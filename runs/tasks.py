"""Celery tasks: thin wrappers that take ids and call `runs.dispatch` / `runs.services`.

No task decides anything. Every one may run twice (`acks_late`: a worker that dies mid-task
has its message redelivered) and that is safe, because the services re-check state under the
run lock: a redelivered `dispatch_outbox_item` finds its item already `dispatching`, `sent` or
`unknown` and does nothing — the claim, not Celery, is what prevents a second send.

Beat runs the periodic ones (see `console.celery.beat_schedule`); `install_dispatch_kick`
additionally queues a dispatch the moment an enqueue commits, so dispatch latency does not wait
for the next beat.
"""

from __future__ import annotations

import logging
from typing import Any

from console.celery import app
from runs import dispatch, notify, services

logger = logging.getLogger(__name__)

TASK_OPTIONS: dict[str, Any] = {"acks_late": True, "ignore_result": True}


@app.task(name="runs.tasks.dispatch_outbox_item", **TASK_OPTIONS)
def dispatch_outbox_item(item_id: int) -> str | None:
    item = dispatch.dispatch_one(item_id)
    return item.status if item is not None else None


@app.task(name="runs.tasks.dispatch_pending", **TASK_OPTIONS)
def dispatch_pending(limit: int = 100) -> int:
    return dispatch.dispatch_pending(limit=limit)


@app.task(name="runs.tasks.reap_stuck_dispatches", **TASK_OPTIONS)
def reap_stuck_dispatches() -> int:
    return dispatch.reap_stuck_dispatches()


@app.task(name="runs.tasks.reap_expired_leases", **TASK_OPTIONS)
def reap_expired_leases() -> int:
    return dispatch.reap_expired_leases()


@app.task(name="runs.tasks.fence_overdue_stops", **TASK_OPTIONS)
def fence_overdue_stops() -> int:
    return dispatch.fence_overdue_stops()


@app.task(name="runs.tasks.enforce_budgets", **TASK_OPTIONS)
def enforce_budgets() -> int:
    return dispatch.enforce_budgets()


@app.task(name="runs.tasks.expire_lease", **TASK_OPTIONS)
def expire_lease(lease_id: int) -> str | None:
    return services.lease_expire(lease_id=lease_id)


@app.task(name="runs.tasks.fence_overdue_stop", **TASK_OPTIONS)
def fence_overdue_stop(run_id: str) -> bool:
    return services.run_fence_overdue(run_id=run_id)


@app.task(name="runs.tasks.enforce_budget", **TASK_OPTIONS)
def enforce_budget(run_id: str) -> bool:
    return services.run_enforce_budget(run_id=run_id) is not None


# --------------------------------------------------------------------------------------------
# kick a dispatch when an enqueue commits (web processes with REDIS_URL)

KICK_KINDS = frozenset({"outbox.enqueued", "outbox.released"})


def _kick_dispatch(event: dict[str, Any]) -> None:
    """Called by `runs.notify` after the enqueue committed (never inside the transaction)."""
    if event.get("kind") not in KICK_KINDS:
        return
    # retry=False: if the broker is down, beat's next `dispatch_pending` picks the item up;
    # a web request must not hang on it.
    dispatch_pending.apply_async(kwargs={"limit": 20}, retry=False, expires=60)


def install_dispatch_kick() -> None:
    """Subscribe the kick to run-change notifications (idempotent). `runs.apps` calls it when
    REDIS_URL is set; domain code stays unaware of Celery."""
    notify.subscribe(_kick_dispatch)


def uninstall_dispatch_kick() -> None:
    notify.unsubscribe(_kick_dispatch)
