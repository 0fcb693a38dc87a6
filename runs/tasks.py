"""Celery tasks: thin wrappers that take ids and call `runs.dispatch` / `runs.services`.

No task decides anything. Every one may run twice (`acks_late`: a message whose worker
vanished before acknowledging it is delivered again once the broker's visibility timeout passes)
and that is safe, because the services re-check state under the run lock: a redelivered `dispatch_outbox_item` finds its item already `dispatching`, `sent` or
`unknown` and does nothing — the claim, not Celery, is what prevents a second send.

Tasks are `@shared_task`s: they bind to the project's Celery app (`console.celery`, loaded by
`console.apps`) without runs importing the console. Beat runs the periodic ones (see
`console.celery.beat_schedule`); `install_dispatch_kick`
additionally queues a dispatch the moment an enqueue commits, so dispatch latency does not wait
for the next beat.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import shared_task

from runs import dispatch, notify, services

logger = logging.getLogger(__name__)

TASK_OPTIONS: dict[str, Any] = {"acks_late": True, "ignore_result": True}


@shared_task(name="runs.tasks.dispatch_outbox_item", **TASK_OPTIONS)
def dispatch_outbox_item(item_id: int) -> str | None:
    item = dispatch.dispatch_one(item_id)
    return item.status if item is not None else None


@shared_task(name="runs.tasks.dispatch_pending", **TASK_OPTIONS)
def dispatch_pending(limit: int = 100) -> int:
    return dispatch.dispatch_pending(limit=limit)


@shared_task(name="runs.tasks.reap_stuck_dispatches", **TASK_OPTIONS)
def reap_stuck_dispatches() -> int:
    return dispatch.reap_stuck_dispatches()


@shared_task(name="runs.tasks.reap_expired_leases", **TASK_OPTIONS)
def reap_expired_leases() -> int:
    return dispatch.reap_expired_leases()


@shared_task(name="runs.tasks.fence_overdue_stops", **TASK_OPTIONS)
def fence_overdue_stops() -> int:
    return dispatch.fence_overdue_stops()


@shared_task(name="runs.tasks.enforce_budgets", **TASK_OPTIONS)
def enforce_budgets() -> int:
    return dispatch.enforce_budgets()


@shared_task(name="runs.tasks.expire_overdue_approvals", **TASK_OPTIONS)
def expire_overdue_approvals() -> int:
    return dispatch.expire_overdue_approvals()


@shared_task(name="runs.tasks.escalate_waiting_approvals", **TASK_OPTIONS)
def escalate_waiting_approvals() -> int:
    return dispatch.escalate_waiting_approvals()


@shared_task(name="runs.tasks.expire_lease", **TASK_OPTIONS)
def expire_lease(lease_id: int) -> str | None:
    return services.lease_expire(lease_id=lease_id)


@shared_task(name="runs.tasks.fence_overdue_stop", **TASK_OPTIONS)
def fence_overdue_stop(run_id: str) -> bool:
    return services.run_fence_overdue(run_id=run_id)


@shared_task(name="runs.tasks.enforce_budget", **TASK_OPTIONS)
def enforce_budget(run_id: str) -> bool:
    return services.run_enforce_budget(run_id=run_id) is not None


# --------------------------------------------------------------------------------------------
# kick a dispatch when an enqueue commits (web processes with REDIS_URL)

KICK_KINDS = frozenset({"outbox.enqueued", "outbox.released"})
KICK_LIMIT = 100

_kick_wanted = threading.Event()
_kicker_lock = threading.Lock()
_kicker: tuple[int, threading.Thread] | None = None  # (pid, thread): a forked child starts its own
_kick_task: Any = None


def _kick_dispatch(event: dict[str, Any]) -> None:
    """Called by `runs.notify` after the enqueue committed (never inside the transaction).

    It only raises a flag: publishing to the broker happens on a small daemon thread, so a web
    request never waits on Redis (a broker that is down costs seconds per connection attempt).
    A burst of enqueues coalesces into one or two kicks; beat's `dispatch_pending` covers the
    rest, and whatever happens here, nothing is lost — the items are in PostgreSQL.
    """
    if event.get("kind") not in KICK_KINDS:
        return
    global _kick_task
    # A shared task is looked up in the *current* Celery app, which Celery keeps per thread:
    # resolve it here, in the thread that committed, not on the kicker thread.
    _kick_task = dispatch_pending._get_current_object()  # type: ignore[attr-defined]
    _kick_wanted.set()
    _ensure_kicker()


def _ensure_kicker() -> None:
    global _kicker
    with _kicker_lock:
        if _kicker is not None and _kicker[0] == os.getpid() and _kicker[1].is_alive():
            return
        thread = threading.Thread(target=_kicker_loop, name="safestop-dispatch-kick", daemon=True)
        _kicker = (os.getpid(), thread)
        thread.start()


def _kicker_loop() -> None:
    while True:
        _kick_wanted.wait()
        _kick_wanted.clear()
        try:
            _kick_task.apply_async(kwargs={"limit": KICK_LIMIT}, retry=False, expires=60)
        except Exception:
            logger.warning(
                "could not queue a dispatch kick; beat will dispatch instead", exc_info=True
            )


def install_dispatch_kick() -> None:
    """Subscribe the kick to run-change notifications (idempotent). `runs.apps` calls it when
    REDIS_URL is set; domain code stays unaware of Celery."""
    notify.subscribe(_kick_dispatch)


def uninstall_dispatch_kick() -> None:
    notify.unsubscribe(_kick_dispatch)
