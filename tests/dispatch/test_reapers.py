"""Lease reaper, drain watchdog, budget enforcer and outbox reaper, driven by `runs.dispatch`."""

from __future__ import annotations

import time

import pytest

from handoff.models import StopPacket
from runs import dispatch, frozen, services
from runs.actors import Actor
from runs.models import (
    ExecutionState,
    Lease,
    LeaseReleaseReason,
    LedgerEntry,
    OutboxStatus,
    Run,
    RunStatus,
    StopRequest,
)
from tests.support.scenarios import make_running, reload

AGENT = Actor.system("agent")
REVIEWER = Actor.system("reviewer-bob")

pytestmark = pytest.mark.django_db(transaction=True)


def _last(run: Run, action: str) -> LedgerEntry:
    return LedgerEntry.objects.filter(run=run, action=action).latest("run_seq")


def test_an_expired_lease_interrupts_the_run_and_records_where_it_stopped(team) -> None:
    run, lease = make_running(team, ttl=0.4)
    services.events_ingest(
        run_id=run.pk,
        epoch=run.stop_epoch,
        actor=AGENT,
        events=[{"event_id": "e1", "type": "step.started", "key": "act"}],
    )
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="call_7",
        tool="deploy",
        side_effect="write",
        actor=AGENT,
    )
    assert dispatch.reap_expired_leases() == 0
    assert reload(run).status == RunStatus.RUNNING

    time.sleep(0.5)
    assert dispatch.reap_expired_leases() == 1

    run = reload(run)
    assert run.status == RunStatus.INTERRUPTED
    assert run.interruption["reason"] == "lease_expired"
    assert run.interruption["current_step"] == {"seq": 2, "key": "act"}
    assert run.interruption["calls_in_flight"] == ["call_7"]
    assert run.interruption["worker_id"] == "worker-1"
    lease.refresh_from_db()
    assert lease.release_reason == LeaseReleaseReason.EXPIRED
    assert run.execution_records.get().execution_state == ExecutionState.UNKNOWN
    entry = _last(run, "run.interrupted")
    assert entry.reason == "lease_expired"
    assert entry.actor == "lease-reaper"
    assert entry.payload["calls_in_flight"] == ["call_7"]
    assert dispatch.reap_expired_leases() == 0  # once


def test_a_stop_never_drained_is_fenced_at_the_deadline_and_ends_dirty(
    team, receiver, settings
) -> None:
    settings.SAFESTOP_DRAIN_DEADLINE_SECONDS = 0.4
    run, lease = make_running(team)
    services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="webhook",
        destination=receiver.url(),
        payload={},
        idempotency_key="k1",
        actor=AGENT,
    )
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    assert reload(run).status == RunStatus.CANCEL_REQUESTED
    assert dispatch.fence_overdue_stops() == 0

    time.sleep(0.5)
    assert dispatch.fence_overdue_stops() == 1

    run = reload(run)
    assert run.status == RunStatus.STOPPED_DIRTY
    stop_request = StopRequest.objects.get(run=run)
    assert stop_request.dirty_reasons[0] == "drain_deadline"
    assert stop_request.outcome_state == RunStatus.STOPPED_DIRTY
    lease.refresh_from_db()
    assert lease.released_at is not None
    assert lease.release_reason == LeaseReleaseReason.REVOKED_BY_STOP
    assert lease.fenced_unconfirmed is True
    packet = StopPacket.objects.get(run=run, stop_epoch=run.stop_epoch).snapshot
    assert packet["state"] == "stopped_dirty"
    assert "drain_deadline" in packet["dirty_reasons"]
    assert packet["lease_released"] is False  # fenced, not confirmed by the worker
    assert packet["frozen_outbox_ids"] != []
    entry = _last(run, "run.stopped_dirty")
    assert entry.reason == "drain_deadline"
    assert entry.actor == "drain-watchdog"
    # The fenced worker's heartbeat is refused from now on.
    with pytest.raises(Exception) as refused:
        services.lease_heartbeat(
            run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT
        )
    assert getattr(refused.value, "code", "") == "lease_revoked"
    assert receiver.count() == 0


def test_the_enforcer_stops_a_run_past_max_seconds_with_reason_timeout(team, receiver) -> None:
    run, lease = make_running(team, max_seconds=1)
    services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="webhook",
        destination=receiver.url(),
        payload={},
        idempotency_key="k1",
        actor=AGENT,
    )
    assert dispatch.enforce_budgets() == 0

    time.sleep(1.15)
    assert dispatch.enforce_budgets() == 1

    run = reload(run)
    assert (
        run.status == RunStatus.CANCEL_REQUESTED
    )  # the same stop a human makes: the worker is told
    assert run.stop_reason == "timeout"
    assert run.stop_epoch == lease.epoch + 1
    stop_request = StopRequest.objects.get(run=run)
    assert (stop_request.reason, stop_request.requested_by) == ("timeout", "budget")
    entry = _last(run, "run.stop_requested")
    assert (entry.reason, entry.actor) == ("timeout", "budget")
    assert frozen.present(run, run.outbox_items.all())[0].status == OutboxStatus.FROZEN
    assert dispatch.dispatch_pending() == 0
    assert dispatch.enforce_budgets() == 0
    assert receiver.count() == 0


def test_the_enforcer_stops_a_run_past_max_tool_calls_with_budget_exhausted(team) -> None:
    run, lease = make_running(team, max_tool_calls=3)
    for n in range(2):
        services.permit_request(
            run_id=run.pk,
            epoch=run.stop_epoch,
            tool_call_id=f"call_{n}",
            tool="search",
            actor=AGENT,
        )
    assert dispatch.enforce_budgets() == 0
    # An operator lowers the budget below what the run already used (there is no service for
    # editing a budget yet; this stands in for the admin).
    Run.objects.filter(pk=run.pk).update(max_tool_calls=1)

    assert dispatch.enforce_budgets() == 1

    run = reload(run)
    assert run.status == RunStatus.CANCEL_REQUESTED
    assert run.stop_reason == "budget_exhausted"
    entry = _last(run, "run.stop_requested")
    assert (entry.reason, entry.actor) == ("budget_exhausted", "budget")
    assert Lease.objects.get(pk=lease.pk).released_at is None  # the worker drains it itself


def test_a_tool_call_over_budget_stops_the_run_through_the_same_stop(team) -> None:
    run, _lease = make_running(team, max_tool_calls=1)
    services.permit_request(
        run_id=run.pk, epoch=run.stop_epoch, tool_call_id="call_0", tool="search", actor=AGENT
    )
    with pytest.raises(Exception) as refused:
        services.permit_request(
            run_id=run.pk, epoch=run.stop_epoch, tool_call_id="call_1", tool="search", actor=AGENT
        )
    assert getattr(refused.value, "code", "") == "run_not_running"
    run = reload(run)
    assert (run.status, run.stop_reason) == (RunStatus.CANCEL_REQUESTED, "budget_exhausted")
    assert _last(run, "run.stop_requested").reason == "budget_exhausted"
    assert dispatch.enforce_budgets() == 0  # already stopped: nothing for the enforcer


def test_a_stuck_dispatch_is_reaped_to_unknown_only_after_the_deadline(
    team, receiver, settings
) -> None:
    settings.SAFESTOP_DISPATCH_DEADLINE_SECONDS = 0.4
    run, _lease = make_running(team)
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="webhook",
        destination=receiver.url(),
        payload={},
        idempotency_key="k1",
        actor=AGENT,
    )
    # A dispatcher claimed it and died before sending (the kill -9 test does this for real).
    assert services.outbox_claim(item_id=item.pk, dispatcher="ghost") is not None
    assert dispatch.reap_stuck_dispatches() == 0

    time.sleep(0.5)
    assert dispatch.reap_stuck_dispatches() == 1

    item.refresh_from_db()
    assert item.status == OutboxStatus.UNKNOWN
    assert "ghost" in item.last_error
    entry = _last(run, "outbox.unknown")
    assert entry.reason == "dispatch_deadline"
    assert dispatch.dispatch_pending() == 0
    assert receiver.count() == 0


def test_one_failing_candidate_does_not_stop_the_others(team, monkeypatch) -> None:
    first, _ = make_running(team, ttl=0.2)
    second, _ = make_running(team, ttl=0.2)
    time.sleep(0.3)
    real = services.lease_expire
    broken_lease = Lease.objects.get(run=first).pk

    def flaky(*, lease_id: int, actor=None):
        if lease_id == broken_lease:
            raise RuntimeError("database blinked")
        return real(lease_id=lease_id, actor=actor)

    monkeypatch.setattr(services, "lease_expire", flaky)
    assert dispatch.reap_expired_leases() == 1
    assert (reload(first).status, reload(second).status) == (
        RunStatus.RUNNING,
        RunStatus.INTERRUPTED,
    )
