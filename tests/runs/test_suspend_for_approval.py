"""A worker that suspends to wait for reviewers (`lease_release(suspend=True)`, DESIGN §2, §10):
the run holds no process while a reviewer decides, the approval survives the released lease,
the next lease at the same epoch picks up the decision, and a stop still ends the run.

Run on PostgreSQL like the rest of the service tests (`DATABASE_URL`).
"""

from __future__ import annotations

import pytest

from runs import services
from runs.actors import Actor
from runs.errors import IllegalTransition, RunNotRunning
from runs.models import (
    ApprovalStatus,
    ExecutionState,
    LedgerEntry,
    RunStatus,
    SideEffectState,
)
from tests.support.scenarios import AGENT, new_run, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def held(team):
    """A running run whose `refund` call waits for a reviewer."""
    run = new_run(team, agent="billing-bot")
    lease = start(run)
    run.refresh_from_db()
    record, _ = ask(run)
    assert record.execution_state == ExecutionState.AWAITING_APPROVAL
    return run, lease, record


def ask(run, call_id="call_refund.e1"):
    return services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id=call_id,
        tool="refund",
        side_effect="write",
        arguments={"order": "1042", "amount": 120},
        needs_approval=True,
        actor=AGENT,
    )


def suspend(run, lease, reason=""):
    return services.lease_release(
        run_id=run.pk,
        lease_token=lease.token,
        epoch=lease.epoch,
        actor=AGENT,
        suspend=True,
        reason=reason,
    )


def reviewer(user):
    return Actor.for_user(user)


def test_the_approval_survives_a_suspend_release_and_the_run_holds_no_lease(held):
    run, lease, record = held
    released = suspend(run, lease, reason="waiting_for_approval")
    run.refresh_from_db()
    record.refresh_from_db()
    assert released.released_at is not None and run.status == RunStatus.SUSPENDED
    assert record.approval.status == ApprovalStatus.WAITING, "not voided"
    assert run.interruption["keeps_approvals"] is True
    assert run.interruption["approvals_waiting"] == [record.approval.public_id]
    assert run.stop_epoch == lease.epoch, "no new epoch: the decision belongs to this one"
    entry = LedgerEntry.objects.filter(run=run, action="run.suspended").get()
    assert entry.payload["via"] == "lease_release"


def test_a_plain_release_still_interrupts_and_voids(held):
    run, lease, record = held
    services.lease_release(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run.refresh_from_db()
    record.approval.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    assert record.approval.status == ApprovalStatus.VOID


def test_decided_while_suspended_and_the_next_lease_gets_the_permit(held, bob):
    run, lease, record = held
    suspend(run, lease)
    services.approval_decide(
        approval_id=record.approval.pk,
        decision="approve",
        arguments={"order": "1042", "amount": 90},
        actor=reviewer(bob),
    )
    run.refresh_from_db()
    assert run.status == RunStatus.SUSPENDED, "deciding does not start anything"
    # Nothing can start while suspended: not even the approved call.
    with pytest.raises(RunNotRunning):
        ask(run)
    second = start(run, worker="worker-2")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and second.epoch == lease.epoch
    assert run.interruption == {}
    again, created = ask(run)
    assert not created and again.pk == record.pk
    assert again.execution_state == ExecutionState.PERMITTED
    assert again.arguments == {"order": "1042", "amount": 90}, "the reviewer's edit"


def test_a_rejection_while_suspended_is_there_for_the_next_lease(held, bob):
    run, lease, record = held
    suspend(run, lease)
    services.approval_decide(
        approval_id=record.approval.pk, decision="reject", message="no", actor=reviewer(bob)
    )
    start(run, worker="worker-2")
    run.refresh_from_db()
    from runs.errors import ApprovalClosed

    with pytest.raises(ApprovalClosed):
        ask(run)


def test_a_stop_while_suspended_ends_the_run_and_voids_what_waits(held, team):
    run, lease, record = held
    other, _ = ask(run, call_id="call_second.e1")
    suspend(run, lease)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=AGENT)
    run.refresh_from_db()
    record.refresh_from_db()
    other.refresh_from_db()
    assert run.status == RunStatus.STOPPED_CLEANLY
    assert record.approval.status == ApprovalStatus.VOID
    assert other.approval.status == ApprovalStatus.VOID
    assert record.execution_state == ExecutionState.NOT_STARTED
    with pytest.raises(RunNotRunning):
        start(run, worker="worker-2")


def test_a_stop_after_an_approval_while_suspended_is_clean_the_call_never_ran(held, bob):
    run, lease, record = held
    suspend(run, lease)
    services.approval_decide(
        approval_id=record.approval.pk, decision="approve", actor=reviewer(bob)
    )
    record.refresh_from_db()
    assert record.execution_state == ExecutionState.PERMITTED
    services.run_stop(run_id=run.pk, reason="user_stop", actor=AGENT)
    run.refresh_from_db()
    record.refresh_from_db()
    # No worker held the run since the suspension: the approved write certainly never ran.
    assert run.status == RunStatus.STOPPED_CLEANLY
    assert record.execution_state == ExecutionState.NOT_STARTED
    assert record.side_effect_state == SideEffectState.NOT_APPLIED


def test_a_resume_instead_of_a_lease_starts_a_new_round(held, bob):
    run, lease, record = held
    suspend(run, lease)
    services.approval_decide(
        approval_id=record.approval.pk, decision="approve", actor=reviewer(bob)
    )
    services.run_resume(run_id=run.pk, actor=reviewer(bob))
    run.refresh_from_db()
    record.refresh_from_db()
    assert run.status == RunStatus.PENDING and run.stop_epoch == lease.epoch + 1
    assert record.execution_state == ExecutionState.NOT_STARTED


def test_suspending_with_a_call_in_flight_is_refused(team):
    run = new_run(team, agent="billing-bot")
    lease = start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk, epoch=run.stop_epoch, tool_call_id="c1", tool="lookup", actor=AGENT
    )
    with pytest.raises(IllegalTransition, match="in flight"):
        suspend(run, lease)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING


def test_approval_on_a_run_suspended_by_event_is_still_refused(held, bob):
    """The `run.suspended` event (no `keeps_approvals`) is unchanged: its run resumes at a
    new epoch, where an approval of the old one could not be used."""
    run, _lease, record = held
    services.events_ingest(
        run_id=run.pk,
        epoch=run.stop_epoch,
        events=[{"event_id": "s1", "type": "run.suspended", "reason": "waiting"}],
        actor=AGENT,
    )
    with pytest.raises(RunNotRunning):
        services.approval_decide(
            approval_id=record.approval.pk, decision="approve", actor=reviewer(bob)
        )
    with pytest.raises(RunNotRunning):
        start(run, worker="worker-2")
