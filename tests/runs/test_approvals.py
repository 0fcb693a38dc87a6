"""Approval gates at the service level (DESIGN §10): what holds a call, what a decision does,
deadlines, escalation, and a stop that voids what waits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import notify, services
from runs.errors import (
    AlreadyDecided,
    ApprovalClosed,
    ApprovalVoid,
    InvalidInput,
    RunNotRunning,
)
from runs.models import (
    Approval,
    ApprovalRule,
    ApprovalStatus,
    ExecutionState,
    LedgerEntry,
    OutboxStatus,
    RunStatus,
    SideEffectState,
)
from tests.support.scenarios import AGENT, new_run, start

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {"amount": {"type": "integer", "maximum": 500}, "to": {"type": "string"}},
    "required": ["amount", "to"],
}


@pytest.fixture
def running(team):
    run = new_run(team, agent="billing-bot")
    lease = start(run)
    run.refresh_from_db()
    return run, lease


def permit(run, call_id="call_1", tool="payments.charge", **extra):
    return services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id=call_id,
        tool=tool,
        side_effect=extra.pop("side_effect", "write"),
        arguments=extra.pop("arguments", {"amount": 120, "to": "acct_9"}),
        actor=AGENT,
        **extra,
    )


def rule(team, **fields):
    defaults = {"name": "payments", "tool_glob": "payments.*", "side_effect": "write"}
    return ApprovalRule.objects.create(team=team, **{**defaults, **fields})


def test_without_a_rule_or_a_flag_a_permit_is_granted_at_once(running):
    run, _ = running
    record, created = permit(run)
    assert created and record.execution_state == ExecutionState.PERMITTED
    assert not Approval.objects.exists()


def test_a_matching_rule_holds_the_call_without_a_permit(running, team):
    run, _ = running
    matched = rule(team, timeout_seconds=600, escalate_after_seconds=60)
    record, created = permit(run)
    assert created and record.execution_state == ExecutionState.AWAITING_APPROVAL
    # a held call has not run: nothing about it is unconfirmed yet
    assert record.side_effect_state == SideEffectState.NONE
    approval = record.approval
    assert approval.status == ApprovalStatus.WAITING and approval.rule == matched
    assert "payments.*" in approval.match_reason
    assert approval.deadline - approval.requested_at == timedelta(seconds=600)
    assert approval.escalate_at - approval.requested_at == timedelta(seconds=60)
    assert LedgerEntry.objects.filter(run=run, action="approval.requested").count() == 1
    assert LedgerEntry.objects.filter(run=run, action="tool.held").count() == 1
    assert not LedgerEntry.objects.filter(run=run, action="tool.permitted").exists()


@pytest.mark.parametrize(
    ("fields", "held"),
    [
        ({"tool_glob": "deploy.*"}, False),
        ({"agent_glob": "other-*"}, False),
        ({"agent_glob": "billing-*"}, True),
        ({"side_effect": "", "tool_glob": "payments.[cx]harge"}, True),
        ({"applies_to": "outbox"}, False),
        ({"enabled": False}, False),
    ],
)
def test_rule_fields_decide_what_is_held(running, team, fields, held):
    run, _ = running
    rule(team, **fields)
    record, _ = permit(run)
    assert (record.execution_state == ExecutionState.AWAITING_APPROVAL) is held


def test_the_first_rule_in_order_decides(running, team):
    run, _ = running
    rule(team, name="late", position=20, timeout_seconds=50)
    rule(team, name="early", position=10, timeout_seconds=40)
    record, _ = permit(run)
    assert record.approval.rule_name == "early"


def test_an_agent_can_ask_for_approval_itself(running):
    run, _ = running
    record, _ = permit(
        run, needs_approval=True, summary="Charge 120", risk="high", arguments_schema=SCHEMA
    )
    approval = record.approval
    assert approval.rule is None and approval.match_reason == "asked by the agent"
    assert (approval.summary, approval.risk, approval.arguments_schema) == (
        "Charge 120",
        "high",
        SCHEMA,
    )


@pytest.mark.parametrize(
    "extra",
    [{"risk": "extreme"}, {"arguments_schema": {"type": "nonsense"}}, {"arguments_schema": []}],
)
def test_bad_approval_asks_are_refused_before_anything_is_written(running, extra):
    run, _ = running
    with pytest.raises(InvalidInput):
        permit(run, needs_approval=True, **extra)
    assert not Approval.objects.exists() and not run.execution_records.exists()


def test_asking_again_while_waiting_answers_the_same_held_call(running):
    run, _ = running
    first, _ = permit(run, needs_approval=True)
    again, created = permit(run, needs_approval=True)
    assert not created and again.pk == first.pk
    assert again.execution_state == ExecutionState.AWAITING_APPROVAL


def test_approve_with_edits_permits_the_final_arguments_and_keeps_both(running, bob):
    run, _ = running
    record, _ = permit(run, needs_approval=True, arguments_schema=SCHEMA)
    decided = services.approval_decide(
        approval_id=record.approval.pk,
        decision="approve",
        actor=services_actor(bob),
        arguments={"amount": 100, "to": "acct_9"},
        message="cap at 100",
    )
    record.refresh_from_db()
    assert decided.status == ApprovalStatus.APPROVED and decided.edited
    assert record.execution_state == ExecutionState.PERMITTED
    assert record.arguments == {"amount": 100, "to": "acct_9"}
    # from now on it may run: a write whose result never arrives is unconfirmed
    assert record.side_effect_state == SideEffectState.PENDING_VERIFICATION
    entry = LedgerEntry.objects.get(run=run, action="approval.approved")
    assert entry.actor == "bob"
    assert entry.payload["original_arguments"] == {"amount": 120, "to": "acct_9"}
    assert entry.payload["arguments"] == {"amount": 100, "to": "acct_9"}


def test_edits_that_fail_the_schema_are_refused_and_nothing_changes(running, bob):
    run, _ = running
    record, _ = permit(run, needs_approval=True, arguments_schema=SCHEMA)
    with pytest.raises(InvalidInput, match="amount"):
        services.approval_decide(
            approval_id=record.approval.pk,
            decision="approve",
            actor=services_actor(bob),
            arguments={"amount": 9000, "to": "acct_9"},
        )
    with pytest.raises(InvalidInput, match="object"):
        services.approval_decide(
            approval_id=record.approval.pk,
            decision="approve",
            actor=services_actor(bob),
            arguments=["not", "an", "object"],
        )
    with pytest.raises(InvalidInput, match="decision"):
        services.approval_decide(
            approval_id=record.approval.pk, decision="maybe", actor=services_actor(bob)
        )
    approval = Approval.objects.get(pk=record.approval.pk)
    assert approval.status == ApprovalStatus.WAITING
    assert not LedgerEntry.objects.filter(action__startswith="approval.a").exists()


def test_reject_means_the_call_never_runs_and_the_message_is_kept(running, bob):
    run, _ = running
    record, _ = permit(run, needs_approval=True)
    services.approval_decide(
        approval_id=record.approval.pk,
        decision="reject",
        actor=services_actor(bob),
        message="wrong account",
    )
    record.refresh_from_db()
    assert record.execution_state == ExecutionState.NOT_STARTED
    assert record.side_effect_state == SideEffectState.NOT_APPLIED
    with pytest.raises(ApprovalClosed) as refused:
        permit(run, needs_approval=True)
    assert refused.value.extra["message"] == "wrong account"


def test_a_second_decision_answers_with_the_first(running, bob, alice):
    run, _ = running
    record, _ = permit(run, needs_approval=True)
    services.approval_decide(
        approval_id=record.approval.pk, decision="reject", actor=services_actor(bob)
    )
    with pytest.raises(AlreadyDecided) as second:
        services.approval_decide(
            approval_id=record.approval.pk, decision="approve", actor=services_actor(alice)
        )
    assert second.value.extra["approval_status"] == "rejected"
    assert second.value.extra["decided_by"] == "bob"


def test_a_stop_voids_what_waits_freezes_held_items_and_the_packet_lists_them(running, bob, team):
    run, lease = running
    record, _ = permit(run, needs_approval=True, summary="Charge 120")
    rule(team, name="mail", tool_glob="", side_effect="", applies_to="outbox", transport="email")
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="email",
        destination="cfo@example.com",
        payload={"subject": "hi"},
        idempotency_key="mail-1",
        actor=AGENT,
    )
    assert item.status == OutboxStatus.AWAITING_APPROVAL
    services.run_stop(run_id=run.pk, reason="user_stop", actor=services_actor(bob))
    # a stop never waits on an approval: all is void before the worker even hears of it
    record.refresh_from_db()
    item.refresh_from_db()
    assert record.execution_state == ExecutionState.NOT_STARTED
    assert item.status == OutboxStatus.FROZEN
    assert set(Approval.objects.values_list("status", flat=True)) == {ApprovalStatus.VOID}
    with pytest.raises(ApprovalVoid):
        services.approval_decide(
            approval_id=record.approval.pk, decision="approve", actor=services_actor(bob)
        )
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED_CLEANLY  # nothing held ever ran: nothing unknown
    packet = run.stop_packets.get().snapshot
    void = packet["approvals_void_at_stop"]
    assert {entry["id"] for entry in void} == {a.public_id for a in Approval.objects.all()}
    assert all(entry["executed"] is False for entry in void)
    assert LedgerEntry.objects.filter(run=run, action="approval.voided").count() == 2


def test_an_approval_from_an_old_epoch_never_permits_new_work(running, bob):
    run, lease = running
    record, _ = permit(run, needs_approval=True)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=services_actor(bob))
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED_CLEANLY
    services.run_resume(run_id=run.pk, actor=services_actor(bob))
    start(run, worker="worker-2")
    run.refresh_from_db()
    with pytest.raises(ApprovalVoid):
        services.approval_decide(
            approval_id=record.approval.pk, decision="approve", actor=services_actor(bob)
        )
    # the old call id cannot come back at the new epoch: a new round needs a new call
    with pytest.raises(Exception, match="already permitted at epoch 1"):
        permit(run, needs_approval=True)


def test_approve_is_refused_while_the_run_is_not_running(running, bob):
    run, lease = running
    record, _ = permit(run, needs_approval=True)
    services.events_ingest(
        run_id=run.pk,
        epoch=run.stop_epoch,
        events=[{"event_id": "s1", "type": "run.suspended", "reason": "waiting"}],
        actor=AGENT,
    )
    with pytest.raises(RunNotRunning):
        services.approval_decide(
            approval_id=record.approval.pk, decision="approve", actor=services_actor(bob)
        )


def test_past_the_deadline_an_approval_expires_as_a_rejection(running):
    run, _ = running
    record, _ = permit(run, needs_approval=True)
    approval = record.approval
    assert not services.approval_expire(approval_id=approval.pk)  # not due yet
    later = approval.deadline + timedelta(seconds=1)
    assert services.approval_expire(approval_id=approval.pk, now=later)
    approval.refresh_from_db()
    record.refresh_from_db()
    assert approval.status == ApprovalStatus.EXPIRED and approval.decided_by == "approval-deadline"
    assert record.execution_state == ExecutionState.NOT_STARTED


def test_escalation_marks_once_and_leaves_a_ledger_entry(running, team):
    run, _ = running
    rule(team, escalate_after_seconds=30)
    record, _ = permit(run)
    approval = record.approval
    later = approval.escalate_at + timedelta(seconds=1)
    assert services.approval_escalate(approval_id=approval.pk, now=later)
    assert not services.approval_escalate(approval_id=approval.pk, now=later)
    approval.refresh_from_db()
    assert approval.escalated_at == later and approval.status == ApprovalStatus.WAITING
    assert LedgerEntry.objects.filter(run=run, action="approval.escalated").count() == 1


def test_the_periodic_sweep_expires_and_escalates_what_is_due(running, team):
    from runs import dispatch

    run, _ = running
    rule(team, escalate_after_seconds=1, timeout_seconds=2)
    first, _ = permit(run, call_id="c1")
    second, _ = permit(run, call_id="c2")
    past = timezone.now() - timedelta(seconds=10)
    Approval.objects.filter(pk=first.approval.pk).update(deadline=past, escalate_at=past)
    Approval.objects.filter(pk=second.approval.pk).update(escalate_at=past)
    report = dispatch.run_periodic_work(dispatch_limit=0)
    assert (report.approvals_expired, report.approvals_escalated) == (1, 1)
    assert Approval.objects.get(pk=first.approval.pk).status == ApprovalStatus.EXPIRED
    assert Approval.objects.get(pk=second.approval.pk).escalated_at is not None


def test_an_approved_outbox_item_becomes_dispatchable_with_the_final_payload(running, team, bob):
    run, _ = running
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="email",
        destination="cfo@example.com",
        payload={"subject": "Q3"},
        idempotency_key="mail-1",
        actor=AGENT,
        needs_approval=True,
    )
    assert services.outbox_claim(item_id=item.pk, dispatcher="d") is None  # held
    services.approval_decide(
        approval_id=item.approval.pk,
        decision="approve",
        actor=services_actor(bob),
        arguments={"subject": "Q3 (final)"},
    )
    item.refresh_from_db()
    assert item.status == OutboxStatus.PENDING and item.payload == {"subject": "Q3 (final)"}
    assert services.outbox_claim(item_id=item.pk, dispatcher="d") is not None


def test_the_decision_is_published_for_the_worker_after_commit(
    running, bob, django_capture_on_commit_callbacks
):
    run, _ = running
    record, _ = permit(run, needs_approval=True)
    heard: list[dict] = []
    notify.subscribe(heard.append)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            services.approval_decide(
                approval_id=record.approval.pk,
                decision="approve",
                actor=services_actor(bob),
                arguments={"amount": 1, "to": "x"},
            )
    finally:
        notify.unsubscribe(heard.append)
    frames = [event["decision"] for event in heard if event.get("kind") == "approval_decided"]
    assert len(frames) == 1 and frames[0]["decision"] == "approve"
    assert frames[0]["permit_id"] == f"permit_{record.pk}"
    assert frames[0]["arguments"] == {"amount": 1, "to": "x"}


def services_actor(user):
    from runs.actors import Actor

    return Actor.for_user(user)


@pytest.mark.parametrize("value", ["appr_x", "²", "appr_١٢", "9" * 30, "appr_1\x00", ""])
def test_malformed_approval_ids_are_not_found(value):
    from runs.errors import NotFound

    with pytest.raises(NotFound):
        services.parse_approval_id(value)
