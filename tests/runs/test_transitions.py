"""Every legal transition of DESIGN §2, and the illegal ones refused with their code."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from handoff import services as handoff_services
from handoff.models import Handoff, HandoffStatus, Resolution, StopPacket
from handoff.services import resolution_record
from runs import services
from runs.actors import Actor
from runs.errors import IllegalTransition, LeaseHeld, LeaseRevoked, RunNotRunning, StaleEpoch
from runs.models import (
    ExecutionState,
    Lease,
    LedgerEntry,
    OutboxStatus,
    RunStatus,
    SideEffectState,
    SteeringStatus,
    StepStatus,
    StopReason,
)
from tests.support.run_factories import run_complete, run_fail, run_suspend
from tests.support.scenarios import (
    SYSTEM,
    make_run,
    make_running,
    outbox_seen,
    reload,
    run_interrupt,
)

pytestmark = pytest.mark.django_db

ALICE = Actor("user", "1", "alice")


def test_create_starts_pending_at_epoch_one_with_planned_steps(team):
    run = make_run(team)
    assert (run.status, run.stop_epoch) == (RunStatus.PENDING, 1)
    assert list(run.steps.values_list("key", "status")) == [
        ("plan", StepStatus.PLANNED),
        ("act", StepStatus.PLANNED),
        ("notify", StepStatus.PLANNED),
    ]
    assert LedgerEntry.objects.filter(run=run, action="run.created").count() == 1


def test_lease_moves_pending_to_running_at_the_current_epoch(team):
    run, lease = make_running(team)
    assert run.status == RunStatus.RUNNING
    assert lease.epoch == run.stop_epoch == 1
    assert lease.token.startswith("lease_")


def test_a_held_lease_refuses_a_second_worker(team):
    run, _lease = make_running(team)
    with pytest.raises(LeaseHeld) as refused:
        services.lease_acquire(run_id=run.pk, worker_id="worker-2", ttl_seconds=30, actor=SYSTEM)
    assert refused.value.code == "lease_held"


def test_complete_fail_and_suspend_are_distinct_states(team):
    completed, lease = make_running(team)
    run_complete(run_id=completed.pk, epoch=lease.epoch, actor=SYSTEM, result={"ok": True})
    failed, lease2 = make_running(team)
    run_fail(run_id=failed.pk, epoch=lease2.epoch, actor=SYSTEM, error="tool broke")
    suspended, lease3 = make_running(team)
    run_suspend(run_id=suspended.pk, epoch=lease3.epoch, actor=SYSTEM, reason="awaiting approval")
    stopped = make_run(team)
    services.run_stop(run_id=stopped.pk, reason=StopReason.USER_STOP, actor=ALICE)
    statuses = {reload(r).status for r in (completed, failed, suspended, stopped)}
    assert statuses == {
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.SUSPENDED,
        RunStatus.STOPPED_CLEANLY,
    }
    assert reload(completed).result == {"ok": True}
    assert reload(failed).failure == {"error": "tool broke"}


def test_suspended_run_releases_its_lease_and_resumes_to_pending_at_a_new_epoch(team):
    run, lease = make_running(team)
    run_suspend(run_id=run.pk, epoch=lease.epoch, actor=SYSTEM, reason="awaiting approval")
    lease.refresh_from_db()
    assert lease.released_at is not None
    resumed = services.run_resume(run_id=run.pk, actor=ALICE)
    assert (resumed.status, resumed.stop_epoch) == (RunStatus.PENDING, 2)


def test_a_pending_run_stops_cleanly_at_once(team):
    run = make_run(team)
    outcome = services.run_stop(
        run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE, note="wrong input"
    )
    run = reload(run)
    assert outcome.created
    assert (run.status, run.stop_epoch, run.stop_reason) == (
        RunStatus.STOPPED_CLEANLY,
        2,
        StopReason.USER_STOP,
    )
    actions = list(LedgerEntry.objects.filter(run=run).values_list("action", flat=True))
    assert actions == ["run.created", "run.stop_requested", "run.draining", "run.stopped_cleanly"]
    packet = StopPacket.objects.get(run=run)
    assert packet.stop_epoch == 2
    assert packet.snapshot["state"] == RunStatus.STOPPED_CLEANLY
    assert [step["key"] for step in packet.snapshot["pending_steps"]] == ["plan", "act", "notify"]


@pytest.mark.parametrize("reason", StopReason.values)
def test_every_stop_reason_is_kept_as_given(team, reason):
    run, _lease = make_running(team)
    services.run_stop(run_id=run.pk, reason=reason, actor=ALICE)
    run = reload(run)
    assert run.status == RunStatus.CANCEL_REQUESTED
    assert run.stop_reason == reason


def test_stop_with_a_live_lease_waits_for_the_worker_then_drains(team):
    run, lease = make_running(team)
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    assert reload(run).status == RunStatus.CANCEL_REQUESTED
    answer = services.lease_heartbeat(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=SYSTEM
    )
    assert answer.signal is not None
    assert answer.signal["type"] == "cancel_requested"
    assert answer.signal["stop_epoch"] == 2
    assert reload(run).status == RunStatus.DRAINING
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=SYSTEM)
    run = reload(run)
    assert run.status == RunStatus.STOPPED_CLEANLY
    lease.refresh_from_db()
    assert lease.released_at is not None
    with pytest.raises(LeaseRevoked):
        services.lease_heartbeat(
            run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=SYSTEM
        )


def test_a_repeated_stop_returns_the_same_request_and_writes_nothing(team):
    run, _lease = make_running(team)
    first = services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    entries = LedgerEntry.objects.count()
    epoch = reload(run).stop_epoch
    second = services.run_stop(run_id=run.pk, reason=StopReason.ADMIN_KILL, actor=ALICE)
    assert not second.created
    assert second.stop_request.pk == first.stop_request.pk
    assert LedgerEntry.objects.count() == entries
    assert reload(run).stop_epoch == epoch


def test_stop_freezes_pending_outbox_and_flags_calls_in_flight(team):
    run, lease = make_running(team)
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=1,
        transport="email",
        destination="ops@example.com",
        payload={"subject": "hi"},
        idempotency_key="mail-1",
        actor=SYSTEM,
    )
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=1,
        tool_call_id="call_1",
        tool="deploy",
        side_effect="write",
        actor=SYSTEM,
    )
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    [item] = outbox_seen(run)
    record.refresh_from_db()
    assert item.status == OutboxStatus.FROZEN and item.frozen_by_epoch == 2
    assert record.cancel_requested and record.remote_cancel_state == "requested"


def test_permit_outbox_and_step_start_at_the_old_epoch_are_refused_as_stale(team):
    run, lease = make_running(team)
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    with pytest.raises(StaleEpoch) as permit_refused:
        services.permit_request(
            run_id=run.pk, epoch=1, tool_call_id="call_late", tool="send", actor=SYSTEM
        )
    assert permit_refused.value.as_dict()["status"] == RunStatus.CANCEL_REQUESTED
    assert permit_refused.value.as_dict()["stop_epoch"] == 2
    with pytest.raises(StaleEpoch):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=1,
            transport="email",
            destination="a@example.com",
            payload={},
            idempotency_key="late",
            actor=SYSTEM,
        )
    answers = services.events_ingest(
        run_id=run.pk,
        epoch=1,
        actor=SYSTEM,
        events=[{"event_id": "e-late", "type": "step.started", "key": "act"}],
    )
    assert answers[0].as_dict() == {
        "event_id": "e-late",
        "status": "rejected",
        "code": "stale_epoch",
        "detail": "epoch 1 is not the run's current epoch 2",
    }
    assert reload(run).late_writes_rejected == 3


def test_the_new_epoch_does_not_open_the_entrance_either(team):
    run, _lease = make_running(team)
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    with pytest.raises(RunNotRunning) as refused:
        services.permit_request(
            run_id=run.pk, epoch=2, tool_call_id="call_x", tool="send", actor=SYSTEM
        )
    assert refused.value.code == "run_not_running"


def test_tool_result_after_stop_is_kept_as_a_fact(team):
    run, lease = make_running(team)
    services.permit_request(
        run_id=run.pk,
        epoch=1,
        tool_call_id="call_9",
        tool="deploy",
        side_effect="write",
        operation_id="deploy-77",
        recovery_policy="query_original",
        actor=SYSTEM,
    )
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    record = services.tool_result_report(
        run_id=run.pk,
        tool_call_id="call_9",
        execution_state="succeeded",
        observation="deployed",
        actor=SYSTEM,
    )
    assert record.reported_after_stop
    assert record.execution_state == ExecutionState.SUCCEEDED
    assert record.side_effect_state == SideEffectState.APPLIED


def test_an_unreported_write_makes_the_stop_dirty_and_the_packet_says_what_to_do(team):
    run, lease = make_running(team)
    services.permit_request(
        run_id=run.pk,
        epoch=1,
        tool_call_id="call_9",
        tool="deploy",
        side_effect="write",
        operation_id="deploy-77",
        recovery_policy="query_original",
        idempotency_key="dep-77",
        actor=SYSTEM,
    )
    services.run_stop(run_id=run.pk, reason=StopReason.MANUAL_TAKEOVER, actor=ALICE)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=1, actor=SYSTEM)
    run = reload(run)
    assert run.status == RunStatus.STOPPED_DIRTY
    packet = StopPacket.objects.get(run=run).snapshot
    unknown = packet["unconfirmed_side_effects"][0]
    assert unknown["tool_call_id"] == "call_9"
    assert unknown["execution_state"] == ExecutionState.UNKNOWN
    assert unknown["side_effect_state"] == SideEffectState.PENDING_VERIFICATION
    assert unknown["recovery_action"] == "query deploy-77; do not re-run deploy"
    assert packet["lease_released"] is True


def test_resolving_the_last_unknown_cleans_the_run_and_a_takeover_hands_it_off(team, bob):
    run, lease = make_running(team)
    services.permit_request(
        run_id=run.pk,
        epoch=1,
        tool_call_id="call_9",
        tool="deploy",
        side_effect="write",
        actor=SYSTEM,
    )
    services.run_takeover(run_id=run.pk, actor=Actor.for_user(bob), note="I'll finish this")
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=1, actor=SYSTEM)
    assert reload(run).status == RunStatus.STOPPED_DIRTY
    resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id="call_9",
        decision="not_applied",
        evidence="deploy-77 not in the deploy log",
        actor=Actor.for_user(bob),
    )
    run = reload(run)
    assert run.status == RunStatus.HANDED_OFF
    handoff = Handoff.objects.get(run=run)
    # Bob took the run over himself: the handoff starts accepted by him.
    assert handoff.assignee == bob and handoff.status == HandoffStatus.ACCEPTED


def test_a_second_resolution_with_another_decision_is_refused(team):
    run, lease = make_running(team)
    services.permit_request(
        run_id=run.pk, epoch=1, tool_call_id="c", tool="pay", side_effect="write", actor=SYSTEM
    )
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=1, actor=SYSTEM)
    resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id="c",
        decision="applied",
        evidence="bank statement",
        actor=ALICE,
    )
    again = resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id="c",
        decision="applied",
        evidence="bank statement",
        actor=ALICE,
    )
    assert not again.created
    with pytest.raises(IllegalTransition):
        resolution_record(
            run_id=run.pk,
            target="tool_call",
            target_id="c",
            decision="compensated",
            evidence="x",
            actor=ALICE,
        )


def test_a_fenced_worker_resolution_is_a_valid_resolution_target(team):
    run, lease = make_running(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=ALICE)
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    services.lease_expire(lease_id=lease.pk)
    assert reload(run).status == RunStatus.STOPPED_DIRTY

    resolution_record(
        run_id=run.pk,
        target="worker",
        target_id=lease.token,
        decision="not_applied",
        evidence="the worker's host was powered off",
        actor=ALICE,
    )

    resolution = Resolution.objects.get(run=run)
    resolution.full_clean()  # `worker` is one of the target choices
    assert resolution.get_target_display() == "Fenced worker"
    assert reload(run).status == RunStatus.STOPPED_CLEANLY


def test_a_handoff_returned_with_a_note_ledgers_the_note(team, bob):
    run = make_run(team)
    services.run_takeover(run_id=run.pk, actor=Actor.for_user(bob))
    handoff = Handoff.objects.get(run=run)

    handoff_services.handoff_return(
        handoff_id=handoff.pk, actor=Actor.for_user(bob), note="back to the agent"
    )

    entry = LedgerEntry.objects.get(run=run, action="run.returned_to_automation")
    assert entry.payload["note"] == "back to the agent"


def test_handoff_complete_return_and_close(team, bob):
    runs = []
    for _ in range(3):
        run = make_run(team)
        services.run_takeover(run_id=run.pk, actor=Actor.for_user(bob))
        runs.append(run)
    handoffs = [Handoff.objects.get(run=run) for run in runs]
    actor = Actor.for_user(bob)
    handoff_services.handoff_accept(handoff_id=handoffs[0].pk, user=bob, actor=actor)
    handoff_services.handoff_complete(handoff_id=handoffs[0].pk, actor=actor, note="done by hand")
    handoff_services.handoff_return(handoff_id=handoffs[1].pk, actor=actor)
    handoff_services.handoff_close(handoff_id=handoffs[2].pk, actor=actor, note="not needed")
    assert [reload(run).status for run in runs] == [
        RunStatus.COMPLETED,
        RunStatus.PENDING,
        RunStatus.CANCELLED,
    ]
    assert reload(runs[1]).stop_epoch == 3
    assert [Handoff.objects.get(pk=h.pk).status for h in handoffs] == [
        HandoffStatus.COMPLETED,
        HandoffStatus.RETURNED,
        HandoffStatus.CLOSED,
    ]


def test_stopped_cleanly_run_can_be_resumed_or_closed_but_a_dirty_one_cannot(team):
    clean = make_run(team)
    services.run_stop(run_id=clean.pk, reason=StopReason.USER_STOP, actor=ALICE)
    assert services.run_resume(run_id=clean.pk, actor=ALICE).stop_epoch == 3
    closable = make_run(team)
    services.run_stop(run_id=closable.pk, reason=StopReason.USER_STOP, actor=ALICE)
    assert services.run_close(run_id=closable.pk, actor=ALICE).status == RunStatus.CANCELLED
    dirty, lease = make_running(team)
    services.permit_request(
        run_id=dirty.pk, epoch=1, tool_call_id="c", tool="pay", side_effect="write", actor=SYSTEM
    )
    services.run_stop(run_id=dirty.pk, reason=StopReason.USER_STOP, actor=ALICE)
    services.run_drained(run_id=dirty.pk, lease_token=lease.token, epoch=1, actor=SYSTEM)
    with pytest.raises(IllegalTransition):
        services.run_close(run_id=dirty.pk, actor=ALICE)
    with pytest.raises(IllegalTransition):
        services.run_resume(run_id=dirty.pk, actor=ALICE)


def test_illegal_transitions_are_refused_with_their_code(team):
    run, lease = make_running(team)
    run_complete(run_id=run.pk, epoch=1, actor=SYSTEM)
    for attempt in (
        lambda: services.run_resume(run_id=run.pk, actor=ALICE),
        lambda: services.run_close(run_id=run.pk, actor=ALICE),
    ):
        with pytest.raises(IllegalTransition) as refused:
            attempt()
        assert refused.value.code == "illegal_transition"
        assert refused.value.status == RunStatus.COMPLETED
    # Nor can a finished run be interrupted: its lease ended with it, so the reaper finds nothing.
    assert services.lease_expire(lease_id=lease.pk) is None
    assert reload(run).status == RunStatus.COMPLETED


def test_stop_after_completion_is_answered_already_finished_and_logged(team):
    run, _lease = make_running(team)
    run_complete(run_id=run.pk, epoch=1, actor=SYSTEM)
    outcome = services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    assert outcome.already_finished and outcome.stop_request is None
    assert reload(run).status == RunStatus.COMPLETED
    assert LedgerEntry.objects.filter(run=run, action="stop.ignored").count() == 1


def test_completion_after_stop_is_kept_as_a_fact_and_does_not_move_the_run(team):
    run, lease = make_running(team)
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    answers = services.events_ingest(
        run_id=run.pk,
        epoch=1,
        actor=SYSTEM,
        events=[{"event_id": "done", "type": "run.completed", "result": {"n": 3}}],
    )
    assert answers[0].status == "rejected" and answers[0].code == "stale_epoch"
    run = reload(run)
    assert run.status == RunStatus.CANCEL_REQUESTED
    assert run.late_reports[0]["result"] == {"n": 3}
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=1, actor=SYSTEM)
    packet = StopPacket.objects.get(run=run).snapshot
    assert packet["reported_after_stop"][0]["type"] == "run.completed"


def test_interrupt_records_the_interruption_point(team):
    run, lease = make_running(team)
    services.events_ingest(
        run_id=run.pk,
        epoch=1,
        actor=SYSTEM,
        events=[{"event_id": "s", "type": "step.started", "key": "act"}],
    )
    services.permit_request(
        run_id=run.pk, epoch=1, tool_call_id="c1", tool="deploy", side_effect="write", actor=SYSTEM
    )
    run_interrupt(run_id=run.pk)
    run = reload(run)
    assert run.status == RunStatus.INTERRUPTED
    assert run.interruption["current_step"] == {"seq": 2, "key": "act"}
    assert run.interruption["calls_in_flight"] == ["c1"]
    with pytest.raises(IllegalTransition):
        services.run_resume(run_id=run.pk, actor=ALICE)  # the unknown write must be resolved first
    resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id="c1",
        decision="not_applied",
        evidence="not in deploy history",
        actor=ALICE,
    )
    assert services.run_resume(run_id=run.pk, actor=ALICE).status == RunStatus.PENDING


def test_steering_not_applied_at_stop_is_marked_and_decided_on_resume(team):
    run, lease = make_running(team)
    applied = services.steering_queue(run_id=run.pk, text="use the EU region", actor=ALICE)
    services.events_ingest(
        run_id=run.pk,
        epoch=1,
        actor=SYSTEM,
        events=[{"event_id": "st", "type": "steering.applied", "steering_id": applied.pk}],
    )
    pending = services.steering_queue(run_id=run.pk, text="also email finance", actor=ALICE)
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    applied.refresh_from_db()
    pending.refresh_from_db()
    assert applied.status == SteeringStatus.APPLIED
    assert pending.status == SteeringStatus.UNAPPLIED_AT_STOP
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=1, actor=SYSTEM)
    packet = StopPacket.objects.get(run=run).snapshot
    assert packet["unapplied_steering"] == [
        {"id": pending.pk, "text": "also email finance", "author": "alice"}
    ]
    services.run_resume(run_id=run.pk, actor=ALICE, carry_over_steering=True)
    pending.refresh_from_db()
    assert pending.status == SteeringStatus.CARRIED_OVER


def test_old_epoch_cannot_touch_a_resumed_round(team):
    run, old_lease = make_running(team)
    services.events_ingest(
        run_id=run.pk,
        epoch=1,
        actor=SYSTEM,
        events=[{"event_id": "a", "type": "step.started", "key": "act"}],
    )
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE)
    services.run_drained(run_id=run.pk, lease_token=old_lease.token, epoch=1, actor=SYSTEM)
    services.run_resume(run_id=run.pk, actor=ALICE)
    new_lease = services.lease_acquire(
        run_id=run.pk, worker_id="worker-2", ttl_seconds=30, actor=SYSTEM
    )
    assert new_lease.epoch == 3
    services.events_ingest(
        run_id=run.pk,
        epoch=3,
        actor=SYSTEM,
        events=[{"event_id": "b", "type": "step.started", "key": "act"}],
    )
    late = services.events_ingest(
        run_id=run.pk,
        epoch=1,
        actor=SYSTEM,
        events=[
            {"event_id": "c", "type": "step.completed", "key": "act"},
            {"event_id": "d", "type": "run.completed"},
        ],
    )
    assert [answer.code for answer in late] == ["stale_epoch", "stale_epoch"]
    run = reload(run)
    assert run.status == RunStatus.RUNNING
    assert run.steps.get(key="act").status == StepStatus.RUNNING
    with pytest.raises(LeaseRevoked):
        services.lease_heartbeat(run_id=run.pk, lease_token=old_lease.token, epoch=1, actor=SYSTEM)


def test_events_are_deduplicated_by_event_id(team):
    run, _lease = make_running(team)
    batch = [
        {"event_id": "e1", "type": "step.started", "key": "plan"},
        {"event_id": "e2", "type": "artifact.added", "name": "report.pdf", "reusable": True},
    ]
    first = services.events_ingest(run_id=run.pk, epoch=1, actor=SYSTEM, events=batch)
    again = services.events_ingest(run_id=run.pk, epoch=1, actor=SYSTEM, events=batch)
    assert [a.status for a in first] == ["accepted", "accepted"]
    assert [a.status for a in again] == ["duplicate", "duplicate"]
    assert run.artifacts.count() == 1


def test_budget_of_tool_calls_stops_the_run_at_the_permit(team):
    run, _lease = make_running(team, max_tool_calls=2)
    for n in range(2):
        services.permit_request(
            run_id=run.pk, epoch=1, tool_call_id=f"c{n}", tool="search", actor=SYSTEM
        )
    with pytest.raises(RunNotRunning):
        services.permit_request(
            run_id=run.pk, epoch=1, tool_call_id="c2", tool="search", actor=SYSTEM
        )
    run = reload(run)
    assert run.status == RunStatus.CANCEL_REQUESTED
    assert run.stop_reason == StopReason.BUDGET_EXHAUSTED


def test_an_interruption_freezes_pending_outbox_and_a_reviewer_can_release_it(team):
    run, _lease = make_running(team)
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=1,
        transport="email",
        destination="ops@example.com",
        payload={},
        idempotency_key="mail-1",
        actor=SYSTEM,
    )
    run_interrupt(run_id=run.pk)
    item.refresh_from_db()
    assert item.status == OutboxStatus.FROZEN
    assert reload(run).interruption["frozen_outbox"] == 1
    assert services.outbox_claim(item_id=item.pk, dispatcher="d") is None
    services.outbox_release(
        run_id=run.pk, item_id=item.pk, actor=ALICE, note="customer asked for it"
    )
    assert services.outbox_claim(item_id=item.pk, dispatcher="d") is not None


def test_a_suspended_runs_pending_outbox_goes_out_after_resume(team):
    run, _lease = make_running(team)
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=1,
        transport="email",
        destination="ops@example.com",
        payload={},
        idempotency_key="mail-1",
        actor=SYSTEM,
    )
    run_suspend(run_id=run.pk, epoch=1, actor=SYSTEM, reason="awaiting approval")
    assert services.outbox_claim(item_id=item.pk, dispatcher="d") is None  # suspended: no dispatch
    services.run_resume(run_id=run.pk, actor=ALICE)
    services.lease_acquire(run_id=run.pk, worker_id="w2", ttl_seconds=30, actor=SYSTEM)
    claimed = services.outbox_claim(item_id=item.pk, dispatcher="d")
    assert claimed is not None and claimed.claim_epoch == 2
