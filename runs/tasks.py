"""Celery tasks: thin wrappers that take ids and call `runs.dispatch` / `runs.services`.

No task decides anything. Every one may run twice (`acks_late`: a message whose worker
vanished before acknowledging it is delivered again once the broker's visibility timeout passes)
and that is safe, because the services re-check state under the run lock: a redelivered `dispatch_outbox_item` finds its item already `dispatching`, `sent` or
`unknown` and does nothing — the claim, not Celery, is what prevents a second send.

Tasks are `@shared_task`s: they bind to the project's Celery app (`console.celery`, loaded by
`console.apps`) without runs importing the console. Work is woken by what needs it (DESIGN §6):
`install_dispatch_kick` wakes the committing process's own dispatcher the moment an enqueue
commits (`runs.local_dispatch`; the worker gets a `dispatch_pending` only for what that leaves),
queues a stop's relabel shortly after it, and a `schedule_wake` after other changes; `wake` runs at the next deadline
(`runs.dispatch.next_deadline`: a lease expiry, a drain deadline, ...) and schedules the one
after. Beat's schedule (`console.celery.beat_schedule`) is only the slow safety net.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import shared_task
from django.conf import settings

from runs import dispatch, notify, services
from runs.local_dispatch import LocalDispatcher

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


@shared_task(name="runs.tasks.relabel_frozen_outbox", **TASK_OPTIONS)
def relabel_frozen_outbox(run_id: str | None = None) -> int:
    """Relabel a stopped run's frozen-by-epoch rows, a few bounded batches at a time; queue
    itself again while rows are left, so other tasks run in between."""
    done = dispatch.relabel_frozen(run_id=run_id, max_batches=RELABEL_BATCHES_PER_TASK)
    if run_id is not None and done and dispatch.has_frozen_by_epoch(run_id):
        relabel_frozen_outbox.apply_async(kwargs={"run_id": run_id}, retry=False)
    return done


RELABEL_BATCHES_PER_TASK = 5


# --------------------------------------------------------------------------------------------
# wakes: periodic work at the moment it falls due, not on a fixed beat


@shared_task(name="runs.tasks.wake", **TASK_OPTIONS)
def wake() -> int:
    """Everything that may have fallen due (the embedded loop's tick: stops first, then
    dispatch, reapers, relabel, registered steps), then a wake scheduled for what falls due
    next. Scheduled at deadlines, queued on changes that make new ones, and run by beat as the
    slow safety net."""
    report = dispatch.run_periodic_work(dispatch_limit=KICK_LIMIT, dispatch_seconds=5.0)
    schedule_next_wake()
    return report.changed


@shared_task(name="runs.tasks.schedule_wake", **TASK_OPTIONS)
def schedule_wake() -> bool:
    """A change may have made a new deadline: make sure a wake is scheduled for the earliest."""
    return schedule_next_wake()


# A wake is at most this late: Celery's timer fires an `eta` task within milliseconds; the
# margin lets the deadline pass before the sweep compares it with `now`.
WAKE_MARGIN_SECONDS = 0.02
# `SET` only if no wake is scheduled at or before this one (and that one is still ahead);
# the key lives a little past its wake, so a lost wake never blocks the next one for long.
_CLAIM_WAKE = """
local current = redis.call('GET', KEYS[1])
if current and tonumber(current) <= tonumber(ARGV[1]) and tonumber(current) > tonumber(ARGV[2])
then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
"""


def schedule_next_wake() -> bool:
    """Schedule one `wake` at the next deadline (`dispatch.next_deadline`), unless one is
    already scheduled at or before it (Redis remembers the earliest, so wakes never multiply).
    True when this call scheduled one. Nothing due, nothing scheduled: an idle server sleeps."""
    deadline = dispatch.next_deadline()
    if deadline is None:
        return False
    now = time.time()
    at = max(deadline.timestamp() + WAKE_MARGIN_SECONDS, now)
    if not _claim_wake(at, now):
        return False
    wake.apply_async(countdown=max(at - now, 0.0), retry=False)
    return True


def _claim_wake(at: float, now: float) -> bool:
    redis_url = getattr(settings, "REDIS_URL", "")
    if not redis_url:
        return True  # no shared store (tests, eager Celery): every scheduler schedules
    try:
        claimed = _redis(redis_url).eval(
            _CLAIM_WAKE, 1, _wake_key(), f"{at:.6f}", f"{now:.6f}", int((at - now) * 1000) + 5000
        )
    except Exception:
        logger.warning("could not record the next wake; scheduling it anyway", exc_info=True)
        return True
    return bool(claimed)


def _wake_key() -> str:
    queue = os.environ.get("SAFESTOP_CELERY_QUEUE", "safestop")
    return f"safestop:next-wake:{queue}"


_redis_clients: dict[str, Any] = {}


def _redis(url: str) -> Any:
    client = _redis_clients.get(url)
    if client is None:
        import redis

        client = _redis_clients[url] = redis.Redis.from_url(url)
    return client


# --------------------------------------------------------------------------------------------
# kicks: queue work the moment a change commits (web processes with REDIS_URL)

# Changes after which there may be something to dispatch right away.
KICK_KINDS = frozenset({"outbox.enqueued", "outbox.released"})
# Changes too frequent to schedule a wake after, and that make no deadline a wake is for (a
# claim's dispatch deadline is a minute away: the wake scheduled by then, or the safety net).
NO_WAKE_KINDS = frozenset(
    {
        "event",
        "events",
        "tool.permitted",  # a held call ("tool.held") has an approval deadline: it wakes
        "tool.result",
        "outbox.enqueued",
        "outbox.released",
        "outbox.claimed",
        "outbox.sent",
        "outbox.failed",
        # A stop's deadline (the drain's) was made by `run.stop_requested`; the worker's ack and
        # a clean settle only end deadlines, and they fall in the moment the worker drains,
        # where a wake's reads took the CPU the drained answer waits for (docs/BENCHMARKS.md).
        # A dirty settle notifies a person: its delivery is due at once, so it wakes.
        "run.draining",
        "run.stopped_cleanly",
    }
)
KICK_LIMIT = 100
# A stop's relabel waits this long, so the worker's drain (which takes the same run lock) is
# not queued behind it.
RELABEL_DELAY_SECONDS = 1.0

_kick_wanted = threading.Event()
_kicker_lock = threading.Lock()
_kicker: tuple[int, threading.Thread] | None = None  # (pid, thread): a forked child starts its own
# What the kicker thread sends next, by key, so a burst coalesces: (task, apply_async options).
_kicks: dict[Any, tuple[Any, dict[str, Any]]] = {}
# The first dispatch of an enqueue happens in the process that committed it.
local_dispatcher = LocalDispatcher()


def _kick_dispatch(event: dict[str, Any]) -> None:
    """Called by `runs.notify` after a change committed (never inside the transaction).

    It only records what to do: an enqueue's dispatch happens on this process's dispatcher
    thread (`local_dispatcher`), and publishing to the broker on a small daemon thread, so a web
    request never waits on a claim or on Redis (a broker that is down costs seconds per
    connection attempt). A burst of changes coalesces into one or two kicks; beat's safety net
    covers the rest, and whatever happens here, nothing is lost — the work is in PostgreSQL.
    """
    kind = event.get("kind")
    wanted: dict[Any, tuple[Any, dict[str, Any]]] = {}
    # A shared task is looked up in the *current* Celery app, which Celery keeps per thread:
    # resolve it here, in the thread that committed, not on the kicker thread.
    if kind in KICK_KINDS:
        dispatch_kick = {
            "dispatch": (
                dispatch_pending._get_current_object(),  # type: ignore[attr-defined]
                {"kwargs": {"limit": KICK_LIMIT}, "expires": 60},
            )
        }
        # This process claims it (runs.local_dispatch); the worker gets what it leaves.
        local_dispatcher.wake(
            item_id=event.get("outbox_id"), on_leftover=lambda: _queue_kicks(dispatch_kick)
        )
    if kind == "run.stop_requested" and event.get("frozen_outbox"):
        wanted[("relabel", event.get("run_id"))] = (
            relabel_frozen_outbox._get_current_object(),  # type: ignore[attr-defined]
            {"kwargs": {"run_id": event.get("run_id")}, "countdown": RELABEL_DELAY_SECONDS},
        )
    if kind not in NO_WAKE_KINDS:
        wanted["wake"] = (
            schedule_wake._get_current_object(),  # type: ignore[attr-defined]
            {"expires": 60},
        )
    if wanted:
        _queue_kicks(wanted)


def _queue_kicks(wanted: dict[Any, tuple[Any, dict[str, Any]]]) -> None:
    with _kicker_lock:
        _kicks.update(wanted)
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
        with _kicker_lock:
            kicks = list(_kicks.values())
            _kicks.clear()
        for task, options in kicks:
            try:
                task.apply_async(retry=False, **options)
            except Exception:
                logger.warning(
                    "could not queue %s; beat's safety net will run it", task.name, exc_info=True
                )


def install_dispatch_kick() -> None:
    """Subscribe the kicks to run-change notifications (idempotent). `runs.apps` calls it when
    REDIS_URL is set; domain code stays unaware of Celery."""
    notify.subscribe(_kick_dispatch)


def uninstall_dispatch_kick() -> None:
    notify.unsubscribe(_kick_dispatch)
