"""The side-effect gateway and the periodic work (DESIGN §6, §8).

Everything here is a thin driver over `runs.services`: the services own every state change and
its lock; these functions find candidates, call the service for each, and do the one thing a
service must never do — talk to the outside world — strictly between two transactions.

Celery tasks (`runs.tasks`) and the embedded background loop (`runs.background`) call exactly
these functions, so production and the one-command default behave the same.

Why the seed's failure case (a message sent after Stop because the dispatcher read the old
state) cannot happen here: the dispatcher never decides from a state it read earlier. It asks
`services.outbox_claim`, which locks the run row — the same lock `run_stop` takes to bump the
epoch that freezes the outbox — and re-reads status and epoch under it: an item below the run's
epoch is frozen (`runs.frozen`) whether or not its row was relabelled yet. An item is therefore
either claimed before the stop commits (in flight: its outcome is recorded, or it becomes
`unknown`) or frozen by it.

Periodic work is woken by what needs it (DESIGN §6): an enqueue kicks the dispatcher, and
`next_deadline` says when the next lease expiry, drain deadline, dispatch deadline, approval
deadline or time budget falls due, so a wake can be scheduled for exactly then; the fixed-rate
sweeps are a slow safety net.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db.models import Min, Q
from django.utils import timezone

from runs import hooks, selectors, services, transports
from runs.models import (
    STOPPING_STATUSES,
    Approval,
    ApprovalStatus,
    Lease,
    OutboxItem,
    OutboxStatus,
    Run,
    RunStatus,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


def dispatcher_name() -> str:
    """Who claimed an item (kept on the item and in the ledger): host, process and thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.current_thread().name}"[:120]


# --------------------------------------------------------------------------------------------
# dispatch


def dispatch_one(item: OutboxItem | int, *, dispatcher: str = "") -> OutboxItem | None:
    """Dispatch one outbox item if it may still go out. Returns the settled item, or None.

    1. claim it (`services.outbox_claim`: run row locked, then the item; refused unless it is a
       pending item of a running run at its current epoch, or a reviewer-released item);
    2. send it with its transport, outside any transaction (no lock is held while we wait
       on the network, so a Stop is never delayed by a slow receiver);
    3. record what the transport knows: `sent`, `failed` or `unknown`.

    A crash between 1 and 3 leaves the item `dispatching`; `reap_stuck_dispatches` turns it
    `unknown` later. It is never claimed again, so it is never sent twice.
    """
    item_id = item.pk if isinstance(item, OutboxItem) else int(item)
    claimed = services.outbox_claim(item_id=item_id, dispatcher=dispatcher or dispatcher_name())
    if claimed is None:
        return None
    return _send_claimed(claimed)


def dispatch_pending(
    *, limit: int = 100, dispatcher: str = "", max_seconds: float | None = None
) -> int:
    """Claim and send claimable items, oldest first, until none is left, `limit` items were
    sent, or (with `max_seconds`) no new claim is started after that long.

    Several dispatchers may run this at once (threads, processes, Celery workers): two that
    pick the same candidate serialise on its run row and only one claim succeeds.
    """
    name = dispatcher or dispatcher_name()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    done = 0
    while done < limit and (deadline is None or time.monotonic() < deadline):
        claimed = services.outbox_claim_next(dispatcher=name)
        if claimed is None:
            break
        _send_claimed(claimed)
        done += 1
    return done


def _send_claimed(item: OutboxItem) -> OutboxItem:
    # The claim's transaction has committed, and it was `durable`, so no outer transaction can
    # be open either: nothing is locked while the request is in flight.
    result = transports.send(item)
    if result.outcome != OutboxStatus.SENT:
        logger.info("outbox %s %s: %s", item.public_id, result.outcome, result.error)
    return services.outbox_record_outcome(
        item_id=item.pk,
        outcome=result.outcome,
        dispatcher=item.claimed_by,
        response_status=result.response_status,
        error=result.error,
    )


# --------------------------------------------------------------------------------------------
# reapers, watchdog, enforcer: scan for candidates, let the service decide under its lock


def _each(candidates: Iterable[T], action: Callable[[T], Any], *, what: str) -> int:
    """Apply `action` to every candidate; one broken row never starves the others."""
    changed = 0
    for candidate in candidates:
        try:
            if action(candidate):
                changed += 1
        except Exception:
            logger.exception("%s failed for %s", what, candidate)
    return changed


def reap_stuck_dispatches(*, older_than_seconds: float | None = None) -> int:
    """Items left `dispatching` past the dispatch deadline become `unknown` (never re-sent).

    The deadline (`SAFESTOP_DISPATCH_DEADLINE_SECONDS`) must be longer than a transport can
    legitimately take (webhook connect + read timeouts); a late answer is still recorded.
    Scans through the `outbox_dispatching_idx` partial index.
    """
    deadline = (
        settings.SAFESTOP_DISPATCH_DEADLINE_SECONDS
        if older_than_seconds is None
        else older_than_seconds
    )
    cutoff = timezone.now() - timedelta(seconds=deadline)
    candidates = list(
        OutboxItem.objects.filter(status=OutboxStatus.DISPATCHING, claimed_at__lt=cutoff)
        .order_by("claimed_at")
        .values_list("pk", flat=True)[:500]
    )
    return _each(
        candidates,
        lambda pk: services.outbox_reap_stuck(item_id=pk, older_than_seconds=deadline),
        what="outbox reaper",
    )


def reap_expired_leases() -> int:
    """Live leases past their expiry: the run is interrupted (`lease_expired`), or a stop that
    was waiting on that worker ends dirty. Scans through the `lease_live_expiry_idx` index."""
    candidates = list(
        Lease.objects.filter(released_at__isnull=True, expires_at__lt=timezone.now())
        .order_by("expires_at")
        .values_list("pk", flat=True)[:500]
    )
    return _each(
        candidates, lambda pk: services.lease_expire(lease_id=pk) is not None, what="lease reaper"
    )


def fence_overdue_stops() -> int:
    """Drain watchdog: runs still `cancel_requested`/`draining` past the drain deadline are
    fenced (lease revoked) and end `stopped_dirty` with `drain_deadline` (`run_stopping_idx`)."""
    cutoff = timezone.now() - timedelta(seconds=settings.SAFESTOP_DRAIN_DEADLINE_SECONDS)
    candidates = list(
        Run.objects.filter(status__in=STOPPING_STATUSES, stop_requested_at__lt=cutoff)
        .order_by("stop_requested_at")
        .values_list("pk", flat=True)[:500]
    )
    return _each(
        candidates, lambda pk: services.run_fence_overdue(run_id=pk), what="drain watchdog"
    )


def enforce_budgets() -> int:
    """Running runs past `max_seconds` / `max_tool_calls` are stopped (`timeout` /
    `budget_exhausted`) through the same stop service a human uses."""
    return _each(
        selectors.runs_over_budget_ids(),
        lambda pk: services.run_enforce_budget(run_id=pk) is not None,
        what="budget enforcer",
    )


def expire_overdue_approvals() -> int:
    """Deny by default (DESIGN §10): waiting approvals past their deadline expire as
    rejections; the held call never runs. Scans through `approval_waiting_idx`."""
    expired, _ = selectors.approvals_due_ids()
    return _each(
        expired, lambda pk: services.approval_expire(approval_id=pk), what="approval deadline"
    )


def escalate_waiting_approvals() -> int:
    """Approvals still waiting at their rule's escalate-after are marked escalated; the
    ledger entry is what notifications deliver (`approval_escalate_idx`)."""
    _, escalate = selectors.approvals_due_ids()
    return _each(
        escalate, lambda pk: services.approval_escalate(approval_id=pk), what="approval escalation"
    )


def relabel_frozen(*, run_id: str | None = None, max_batches: int = 10) -> int:
    """Relabel rows a stop's epoch froze (`services.outbox_relabel_frozen`), at most
    `max_batches` batches: one run's, or (without `run_id`) those of every run found with
    some. Returns how many rows; the caller comes back while a run has more."""
    run_ids = [run_id] if run_id else selectors.runs_with_frozen_by_epoch(limit=max_batches)
    done = 0
    batches = 0
    for pk in run_ids:
        while batches < max_batches:
            batches += 1
            relabelled = services.outbox_relabel_frozen(run_id=pk)
            done += relabelled
            if relabelled < services.RELABEL_BATCH:
                break
    return done


def has_frozen_by_epoch(run_id: str) -> bool:
    return bool(selectors.runs_with_frozen_by_epoch(limit=1, run_id=run_id))


# --------------------------------------------------------------------------------------------
# when is periodic work next due


# While a running run has a budget only events can exhaust (tool calls, cost, tokens), the
# enforcer looks this often.
BUDGET_POLL_SECONDS = 1.0


def next_deadline(*, now: datetime | None = None) -> datetime | None:
    """The earliest moment some periodic work falls due, or None when nothing will: a live
    lease's expiry, an unsettled stop's drain deadline, a claimed item's dispatch deadline, a
    waiting approval's deadline or escalation, a running run's time budget (or, with an event
    budget, the next poll), and what other apps registered (`hooks.on_deadline`). Each is a
    MIN over a partial index; on an idle server every one is empty."""
    now = now or timezone.now()
    drain = timedelta(seconds=settings.SAFESTOP_DRAIN_DEADLINE_SECONDS)
    dispatch_deadline = timedelta(seconds=settings.SAFESTOP_DISPATCH_DEADLINE_SECONDS)
    candidates: list[datetime | None] = [
        Lease.objects.filter(released_at__isnull=True).aggregate(at=Min("expires_at"))["at"],
        _plus(
            Run.objects.filter(status__in=STOPPING_STATUSES).aggregate(at=Min("stop_requested_at"))[
                "at"
            ],
            drain,
        ),
        _plus(
            OutboxItem.objects.filter(status=OutboxStatus.DISPATCHING).aggregate(
                at=Min("claimed_at")
            )["at"],
            dispatch_deadline,
        ),
        Approval.objects.filter(status=ApprovalStatus.WAITING).aggregate(at=Min("deadline"))["at"],
        Approval.objects.filter(status=ApprovalStatus.WAITING, escalated_at__isnull=True).aggregate(
            at=Min("escalate_at")
        )["at"],
        *_budget_deadlines(now),
        *(deadline() for _name, deadline in hooks.deadlines()),
    ]
    due = [at for at in candidates if at is not None]
    return min(due) if due else None


def _plus(at: datetime | None, delta: timedelta) -> datetime | None:
    return at + delta if at is not None else None


def _budget_deadlines(now: datetime) -> list[datetime | None]:
    running = Run.objects.filter(status=RunStatus.RUNNING)
    polled = running.filter(
        Q(max_tool_calls__isnull=False)
        | Q(max_cost_usd__isnull=False)
        | Q(max_tokens__isnull=False)
    ).exists()
    timed: list[datetime] = [
        started + timedelta(seconds=float(seconds))
        for started, seconds in running.filter(
            max_seconds__isnull=False, started_at__isnull=False
        ).values_list("started_at", "max_seconds")[:1000]
        if started is not None and seconds is not None
    ]
    return [
        min(timed) if timed else None,
        now + timedelta(seconds=BUDGET_POLL_SECONDS) if polled else None,
    ]


# --------------------------------------------------------------------------------------------
# one tick of everything (the embedded loop; Celery beat schedules the parts separately)


@dataclass
class TickReport:
    leases_expired: int = 0
    budgets_enforced: int = 0
    stops_fenced: int = 0
    dispatched: int = 0
    dispatches_reaped: int = 0
    outbox_relabelled: int = 0
    approvals_expired: int = 0
    approvals_escalated: int = 0
    # Steps other apps registered (`runs.hooks.on_periodic`), by name.
    registered: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def changed(self) -> int:
        return (
            self.leases_expired
            + self.budgets_enforced
            + self.stops_fenced
            + self.dispatched
            + self.dispatches_reaped
            + self.outbox_relabelled
            + self.approvals_expired
            + self.approvals_escalated
            + sum(self.registered.values())
        )


def run_periodic_work(
    *, dispatch_limit: int = 100, dispatch_seconds: float | None = None, dispatcher: str = ""
) -> TickReport:
    """All periodic work once. Stops first (expired leases, budgets, overdue drains), so a run
    that must stop this tick does not dispatch first; then dispatch; then the outbox reaper.

    `dispatch_seconds` bounds how long one tick keeps starting sends, so in a single-threaded
    loop a backlog for a slow receiver cannot hold the lease reaper and drain watchdog back.
    """
    report = TickReport()
    steps: list[tuple[str, Callable[[], int]]] = [
        ("leases_expired", reap_expired_leases),
        ("budgets_enforced", enforce_budgets),
        ("stops_fenced", fence_overdue_stops),
        ("approvals_expired", expire_overdue_approvals),
        ("approvals_escalated", escalate_waiting_approvals),
        (
            "dispatched",
            lambda: dispatch_pending(
                limit=dispatch_limit, dispatcher=dispatcher, max_seconds=dispatch_seconds
            ),
        ),
        ("dispatches_reaped", reap_stuck_dispatches),
        ("outbox_relabelled", relabel_frozen),
    ]
    for name, step in steps:
        try:
            setattr(report, name, step())
        except (
            Exception
        ) as exc:  # one failing part (e.g. the database blinked) never stops the rest
            logger.exception("periodic work %s failed", name)
            report.errors.append(f"{name}: {type(exc).__name__}: {exc}")
    for name, registered_step in hooks.periodic_steps():
        try:
            report.registered[name] = registered_step()
        except Exception as exc:
            logger.exception("periodic work %s failed", name)
            report.errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return report
