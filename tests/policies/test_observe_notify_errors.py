"""Observe mode changes nothing; notify goes through the notification channels; an
evaluation error fails closed (DESIGN §14)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from notifications.events import event_for_entry
from policies.models import Policy, PolicyHit
from policies.periodic import TIME_RULE_PERIOD, next_time_rule_deadline, policies_tick
from policies.reads import policies_changed
from policies.services import policy_update
from runs.errors import RunNotRunning
from runs.models import Approval, ExecutionState, LedgerEntry, Run, RunStatus, StopRequest
from tests.support.policies import ADMIN, permit, policy
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db


def test_observe_records_a_would_act_hit_and_changes_nothing(team):
    watcher = policy(team, "loop", "call.repeats >= 2", mode="observe")
    run, _lease = make_running(team)
    for n in range(4):
        record, _ = permit(run, f"c{n}")
        assert record.execution_state == ExecutionState.PERMITTED
    assert reload(run).status == RunStatus.RUNNING
    assert not StopRequest.objects.filter(run=run).exists()
    hit = PolicyHit.objects.get(policy=watcher)  # once per run
    assert (hit.outcome, hit.mode, hit.action) == ("would_act", "observe", "stop")
    observed = LedgerEntry.objects.get(run=run, action="policy.observed")
    assert observed.actor == "policy:loop"
    assert observed.payload["values"] == {"call.repeats": 2}


def test_notify_writes_one_ledger_entry_that_notifies(team):
    policy(team, "big-spend-call", 'call.tool == "search"', action="notify")
    run, _lease = make_running(team)
    permit(run, "c1", arguments={"q": 1})
    permit(run, "c2", arguments={"q": 2})
    assert reload(run).status == RunStatus.RUNNING
    entry = LedgerEntry.objects.get(run=run, action="policy.notified")
    notice = event_for_entry(entry, run)
    assert notice is not None and notice.event == "policy.notified"
    assert "big-spend-call" in notice.message["title"]


def test_a_policy_stop_notifies_once(team):
    policy(team, "loop", "call.repeats >= 1")
    run, _lease = make_running(team)
    with pytest.raises(RunNotRunning):
        permit(run, "c1")
    notices = [
        notice
        for entry in LedgerEntry.objects.filter(run=run)
        if (notice := event_for_entry(entry, run)) is not None and notice.event == "policy.stopped"
    ]
    assert len(notices) == 1
    assert "loop" in notices[0].message["title"]


def test_a_person_stop_does_not_notify_as_a_policy(team):
    from runs import services
    from tests.support.scenarios import AGENT

    run, _lease = make_running(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=AGENT)
    entry = LedgerEntry.objects.get(run=run, action="run.stop_requested")
    assert event_for_entry(entry, run) is None


def test_a_missing_field_fails_closed_by_holding_the_call(team):
    broken = policy(team, "needs-amount", "call.arguments.amount > 100")
    run, _lease = make_running(team)
    held, _ = permit(run, "c1", side_effect="write", arguments={"to": "x"})
    assert held.execution_state == ExecutionState.AWAITING_APPROVAL
    approval = Approval.objects.get(execution_record=held)
    assert approval.rule_name == "needs-amount"
    assert "evaluation error" in approval.match_reason
    broken.refresh_from_db()
    assert broken.errors_count == 1
    assert "amount" in broken.last_error
    outcomes = sorted(PolicyHit.objects.filter(policy=broken).values_list("outcome", flat=True))
    assert outcomes == ["acted", "error"]
    assert reload(run).status == RunStatus.RUNNING


def test_a_type_error_with_on_error_stop_stops(team):
    # `dyn` arguments pass the checker; a string compared with a number fails at run time.
    policy(team, "typed", "call.arguments.amount > 100", on_error="stop")
    run, _lease = make_running(team)
    with pytest.raises(RunNotRunning):
        permit(run, "c1", arguments={"amount": "lots"})
    stop = StopRequest.objects.get(run=run)
    assert stop.reason == "policy_violation" and "evaluation error" in stop.note


def test_on_error_ignore_and_observe_mode_errors_change_nothing(team):
    ignoring = policy(team, "ignoring", "call.arguments.amount > 100", on_error="ignore")
    watching = policy(team, "watching", "call.arguments.amount > 100", mode="observe")
    run, _lease = make_running(team)
    record, _ = permit(run, "c1", side_effect="write", arguments={})
    assert record.execution_state == ExecutionState.PERMITTED
    for counted in (ignoring, watching):
        counted.refresh_from_db()
        assert counted.errors_count == 1


def test_a_policy_edited_mid_flight_applies_from_the_next_fact(team):
    loop = policy(team, "loop", "call.repeats >= 5")
    run, _lease = make_running(team)
    permit(run, "c1")
    permit(run, "c2")
    policy_update(policy_id=loop.pk, actor=ADMIN, expression="call.repeats >= 3")
    with pytest.raises(RunNotRunning):
        permit(run, "c3")
    assert "call.repeats >= 3" in StopRequest.objects.get(run=run).note


def test_a_stored_expression_that_no_longer_compiles_fails_closed(team):
    loop = policy(team, "loop", "call.repeats >= 5")
    # Written past the service (as a restore or a hand edit would), with the new version of
    # the team's policy set the service would have written.
    Policy.objects.filter(pk=loop.pk).update(expression="run.vanished > 1")
    policies_changed(team.pk)
    run, _lease = make_running(team)
    held, _ = permit(run, "c1", side_effect="write")
    assert held.execution_state == ExecutionState.AWAITING_APPROVAL
    loop.refresh_from_db()
    assert "no longer compiles" in loop.last_error


def test_the_tick_stops_a_run_past_its_time(team):
    policy(team, "too-long", "run.elapsed_seconds > 60.0")
    run, _lease = make_running(team)
    policies_tick()
    assert reload(run).status == RunStatus.RUNNING
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Run

    Run.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    assert policies_tick() == 1
    run = reload(run)
    assert run.stop_reason == "policy_violation"
    assert StopRequest.objects.get(run=run).requested_by == "policy:too-long"


def test_time_rules_wake_the_periodic_work_only_while_they_have_a_running_run(team):
    from runs import dispatch

    assert next_time_rule_deadline() is None  # no time rule: an idle server is never woken
    policy(team, "too-long", "run.elapsed_seconds > 60.0")
    assert next_time_rule_deadline() is None  # a rule, but no running run to look at
    run, _lease = make_running(team)
    due = next_time_rule_deadline()
    assert due is not None and due <= timezone.now() + TIME_RULE_PERIOD
    woken = dispatch.next_deadline()
    assert woken is not None and woken <= timezone.now() + TIME_RULE_PERIOD
    Run.objects.filter(pk=run.pk).update(status=RunStatus.STOPPED_CLEANLY)
    assert next_time_rule_deadline() is None
