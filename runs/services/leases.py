"""Leases: a worker acquires the run at its current epoch, renews it by heartbeat (the answer
carries the stop signal), releases it, or loses it to the reaper.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from runs import notify
from runs.actors import Actor
from runs.errors import (
    IllegalTransition,
    LeaseHeld,
    LeaseRevoked,
    RunNotRunning,
    StaleEpoch,
)
from runs.ledger import ledger_append
from runs.models import (
    STOPPING_STATUSES,
    Approval,
    ApprovalStatus,
    ExecutionRecord,
    Lease,
    LeaseReleaseReason,
    Run,
    RunStatus,
    StopReason,
)
from runs.services._base import (
    OPEN_EXECUTION_STATES,
    current_stop_request,
    find_lease,
    live_lease,
    locked_run,
    release_lease,
    run_mark_changed,
    run_move,
)
from runs.services.approvals import keeps_approvals
from runs.services.lifecycle import (
    acknowledge_stop_locked,
    drained_locked,
    interrupt_locked,
    settle_locked,
)


def lease_acquire(*, run_id: str, worker_id: str, ttl_seconds: float, actor: Actor) -> Lease:
    """pending → running, or suspended → running for a run its worker suspended to wait for
    reviewers (`lease_release(suspend=True)`): the next worker goes on at the same epoch, where
    the approvals decided meanwhile belong. The lease carries the run's current epoch."""
    with locked_run(run_id) as run:
        now = timezone.now()
        lease = live_lease(run)
        if lease is not None and lease.expires_at > now:
            raise LeaseHeld.for_run(
                run, f"the run is leased by {lease.worker_id} until {lease.expires_at.isoformat()}"
            )
        resuming_suspended = keeps_approvals(run)
        if run.status != RunStatus.PENDING and not resuming_suspended:
            raise RunNotRunning.for_run(run, f"a {run.status} run cannot be leased")
        if resuming_suspended:
            run.interruption = {}
        if lease is not None:  # an expired leftover on a pending run: close it before the new one
            release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
        lease = Lease.objects.create(
            run=run,
            worker_id=worker_id,
            epoch=run.stop_epoch,
            token="lease_" + secrets.token_hex(16),
            acquired_at=now,
            heartbeat_at=now,
            expires_at=now + timedelta(seconds=ttl_seconds),
            ttl_seconds=ttl_seconds,
        )
        if run.started_at is None:
            run.started_at = now
        run_move(
            run,
            RunStatus.RUNNING,
            actor=actor,
            action="lease.acquired",
            payload={"worker_id": worker_id, "lease_id": lease.token, "epoch": lease.epoch},
            fields=("started_at", "interruption"),
        )
    return lease


@dataclass
class HeartbeatAnswer:
    lease: Lease
    signal: dict[str, Any] | None


def lease_heartbeat(*, run_id: str, lease_token: str, epoch: int, actor: Actor) -> HeartbeatAnswer:
    """Renew the lease. After a stop, the answer carries the signal and counts as the ack."""
    expired_run = False
    with locked_run(run_id) as run:
        lease = find_lease(run, lease_token)
        now = timezone.now()
        if epoch != lease.epoch:
            raise StaleEpoch.for_run(
                run, f"the lease was acquired at epoch {lease.epoch}, not {epoch}"
            )
        if lease.released_at is not None:
            raise LeaseRevoked.for_run(run, f"the lease was {lease.release_reason or 'released'}")
        if lease.expires_at <= now and run.status == RunStatus.RUNNING:
            # Too late: another worker may be about to take over. Interrupt now rather than
            # let a worker that missed its deadline carry on as if nothing happened.
            interrupt_locked(
                run, reason=StopReason.LEASE_EXPIRED, actor=Actor.system("lease-reaper"), now=now
            )
            expired_run = True
        else:
            lease.heartbeat_at = now
            lease.expires_at = now + timedelta(seconds=lease.ttl_seconds)
            lease.save(update_fields=["heartbeat_at", "expires_at"])
            signal = None
            if run.status in STOPPING_STATUSES:
                stop_request = current_stop_request(run)
                signal = notify.signal_payload(stop_request)
                if run.status == RunStatus.CANCEL_REQUESTED:
                    acknowledge_stop_locked(
                        run, stop_request, actor=actor, now=now, via="heartbeat"
                    )
            return HeartbeatAnswer(lease=lease, signal=signal)
    if expired_run:
        raise LeaseRevoked(
            "the lease expired before this heartbeat; the run is interrupted",
            status=RunStatus.INTERRUPTED,
            stop_epoch=run.stop_epoch,
        )
    raise AssertionError("unreachable")


def lease_release(
    *,
    run_id: str,
    lease_token: str,
    epoch: int,
    actor: Actor,
    suspend: bool = False,
    reason: str = "",
) -> Lease:
    """The worker gives its lease back. During a stop this is a drain with no observations.

    With `suspend`, a running run is suspended instead of interrupted: its worker stops on
    purpose to wait for reviewers without holding a process (see `_suspend_locked`).
    """
    with locked_run(run_id) as run:
        lease = find_lease(run, lease_token)
        if epoch != lease.epoch:
            raise StaleEpoch.for_run(
                run, f"the lease was acquired at epoch {lease.epoch}, not {epoch}"
            )
        if lease.released_at is not None:
            return lease  # releasing twice is a retry, not an error
        now = timezone.now()
        if run.status in STOPPING_STATUSES:
            drained_locked(run, lease, observations=[], actor=actor, now=now)
            return lease
        if suspend:
            _suspend_locked(run, lease, reason=reason, actor=actor, now=now)
            return lease
        release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
        if run.status == RunStatus.RUNNING and lease.epoch == run.stop_epoch:
            # A running run left without a worker is interrupted, and only a resume (new epoch)
            # lets a worker start again, so the releasing worker is fenced off for good.
            interrupt_locked(
                run, reason="worker_released", actor=actor, now=now, lease_already_closed=True
            )
        else:
            ledger_append(
                run=run, actor=actor, action="lease.released", payload={"lease_id": lease.token}
            )
            run_mark_changed(run, kind="lease.released")
    return lease


def _suspend_locked(run: Run, lease: Lease, *, reason: str, actor: Actor, now: datetime) -> None:
    """running → suspended, the lease released, the waiting approvals kept open (DESIGN §2, §10).

    Unlike a release (an interruption: approvals void, calls in flight unknown), the worker says
    it has nothing in flight and will go on only through a new lease: reviewers decide while
    no process holds the run, and the next lease, at the same epoch, picks the decisions up. A
    stop of the suspended run still ends it and voids what waits. Calls still in flight are
    refused: their outcome must be reported first, or the suspension would hide them.
    """
    if run.status != RunStatus.RUNNING or lease.epoch != run.stop_epoch:
        raise IllegalTransition.for_run(run, f"a {run.status} run cannot be suspended")
    in_flight = list(
        ExecutionRecord.objects.filter(
            run=run, execution_state__in=OPEN_EXECUTION_STATES
        ).values_list("tool_call_id", flat=True)
    )
    if in_flight:
        raise IllegalTransition.for_run(
            run,
            "report the outcome of the tool calls in flight before suspending: "
            + ", ".join(in_flight[:20]),
        )
    release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    waiting = [
        approval.public_id
        for approval in Approval.objects.filter(run=run, status=ApprovalStatus.WAITING).order_by(
            "id"
        )
    ]
    run.interruption = {
        "suspended_because": (reason or "waiting_for_approval")[:500],
        "at": now.isoformat(),
        "keeps_approvals": True,
        "worker_id": lease.worker_id,
        "approvals_waiting": waiting,
    }
    run_move(
        run,
        RunStatus.SUSPENDED,
        actor=actor,
        action="run.suspended",
        reason=(reason or "waiting_for_approval")[:60],
        payload={"via": "lease_release", "lease_id": lease.token, "approvals_waiting": waiting},
        fields=("interruption",),
    )


def lease_expire(*, lease_id: int, actor: Actor | None = None) -> str | None:
    """Lease reaper: an expired live lease interrupts a running run, or ends a stop dirty."""
    actor = actor or Actor.system("lease-reaper")
    # Which run owns it never changes: read outside the transaction, whose first query is the lock.
    run_id = Lease.objects.filter(pk=lease_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return None
    with locked_run(run_id) as run:
        lease = Lease.objects.get(pk=lease_id)
        now = timezone.now()
        if lease.released_at is not None or lease.expires_at > now:
            return None  # renewed or released while we waited for the lock
        if run.status == RunStatus.RUNNING and lease.epoch == run.stop_epoch:
            interrupt_locked(run, reason=StopReason.LEASE_EXPIRED, actor=actor, now=now)
            return RunStatus.INTERRUPTED
        if run.status in STOPPING_STATUSES:
            release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now, fenced=True)
            settle_locked(
                run, actor=actor, now=now, forced_dirty_reason="lease_expired_during_drain"
            )
            return run.status
        release_lease(lease, reason=LeaseReleaseReason.EXPIRED, now=now)
        ledger_append(
            run=run, actor=actor, action="lease.expired", payload={"lease_id": lease.token}
        )
        run_mark_changed(run, kind="lease.expired")
        return run.status
