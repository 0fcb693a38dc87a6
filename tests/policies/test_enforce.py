"""Enforce mode (DESIGN §14): a policy stops or holds a run in the transaction of the fact
that broke it, through the stop service and the approval gate."""

from __future__ import annotations

import pytest

from policies.models import PolicyHit, RunFacts
from runs.errors import RunNotRunning
from runs.models import (
    Approval,
    ApprovalStatus,
    ExecutionState,
    LedgerEntry,
    RunStatus,
    StopRequest,
)
from tests.support.policies import batch, permit, policy, result
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db

LOOP = "call.repeats >= 3"


def test_a_loop_is_stopped_at_the_permit_that_repeats_it(team):
    loop = policy(team, "loop", LOOP)
    run, _lease = make_running(team)
    permit(run, "c1")
    permit(run, "c2")
    with pytest.raises(RunNotRunning) as refused:
        permit(run, "c3")
    assert "loop" in refused.value.detail
    run = reload(run)
    assert run.status in (RunStatus.CANCEL_REQUESTED, RunStatus.DRAINING)
    assert run.stop_reason == "policy_violation"
    stop = StopRequest.objects.get(run=run)
    assert stop.requested_by == "policy:loop"
    assert LOOP in stop.note and "call.repeats=3" in stop.note
    entries = LedgerEntry.objects.filter(run=run, action="run.stop_requested")
    assert [(e.actor, e.reason) for e in entries] == [("policy:loop", "policy_violation")]
    hit = PolicyHit.objects.get(policy=loop, run=run)
    assert (hit.outcome, hit.action, hit.stop_request_id) == ("acted", "stop", stop.pk)
    assert hit.values == {"call.repeats": 3}


def test_other_arguments_reset_the_repeats(team):
    policy(team, "loop", LOOP)
    run, _lease = make_running(team)
    permit(run, "c1", arguments={"q": "a"})
    permit(run, "c2", arguments={"q": "a"})
    permit(run, "c3", arguments={"q": "b"})
    permit(run, "c4", arguments={"q": "a"})
    assert reload(run).status == RunStatus.RUNNING
    assert RunFacts.objects.get(run=run).repeats == 1


def test_the_same_arguments_in_another_key_order_are_the_same_call(team):
    policy(team, "loop", "call.repeats >= 2")
    run, _lease = make_running(team)
    permit(run, "c1", arguments={"a": 1, "b": 2})
    with pytest.raises(RunNotRunning):
        permit(run, "c2", arguments={"b": 2, "a": 1})


def test_a_run_already_stopping_gets_no_second_stop(team):
    policy(team, "streak", "run.tool_failures_in_a_row >= 1")
    policy(team, "loop", "call.repeats >= 1")
    run, _lease = make_running(team)
    with pytest.raises(RunNotRunning):
        permit(run, "c1")
    # The loop policy stopped the run; the failure of the call in flight matches "streak"
    # while the run is stopping: no second stop request.
    assert StopRequest.objects.filter(run=run).count() == 1
    assert PolicyHit.objects.filter(run=run).count() == 1


def test_a_failure_streak_stops_at_the_result(team):
    policy(team, "streak", "run.tool_failures_in_a_row >= 2")
    run, _lease = make_running(team)
    permit(run, "c1", arguments={"q": 1})
    permit(run, "c2", arguments={"q": 2})
    result(run, "c1", ExecutionState.FAILED)
    assert reload(run).status == RunStatus.RUNNING
    result(run, "c2", ExecutionState.FAILED)
    run = reload(run)
    assert run.stop_reason == "policy_violation"
    assert StopRequest.objects.get(run=run).requested_by == "policy:streak"


def test_a_success_ends_the_streak(team):
    policy(team, "streak", "run.tool_failures_in_a_row >= 2")
    run, _lease = make_running(team)
    for n in range(3):
        permit(run, f"c{n}", arguments={"q": n})
    result(run, "c0", ExecutionState.FAILED)
    result(run, "c1", ExecutionState.SUCCEEDED)
    result(run, "c2", ExecutionState.FAILED)
    assert reload(run).status == RunStatus.RUNNING
    assert RunFacts.objects.get(run=run).tool_failures_in_a_row == 1


def test_take_over_stops_with_a_takeover(team):
    policy(team, "loop", "call.repeats >= 2", action="stop_and_take_over")
    run, _lease = make_running(team)
    permit(run, "c1")
    with pytest.raises(RunNotRunning):
        permit(run, "c2")
    assert StopRequest.objects.get(run=run).takeover is True


def test_a_destination_outside_the_allow_list_holds_the_call(team):
    rule = policy(
        team,
        "allow-list",
        'call.side_effect == "write" && !(call.destination_host in ["api.example.com"])',
        action="require_approval",
    )
    run, _lease = make_running(team)
    allowed, _ = permit(
        run, "c1", side_effect="write", arguments={"url": "https://api.example.com/x"}
    )
    assert allowed.execution_state == ExecutionState.PERMITTED
    held, _ = permit(run, "c2", side_effect="write", arguments={"url": "https://evil.test/x"})
    assert held.execution_state == ExecutionState.AWAITING_APPROVAL
    approval = Approval.objects.get(execution_record=held)
    assert approval.status == ApprovalStatus.WAITING
    assert approval.rule_name == "allow-list"
    assert "allow-list" in approval.match_reason and "evil.test" in approval.match_reason
    assert PolicyHit.objects.get(policy=rule).outcome == "acted"
    assert reload(run).status == RunStatus.RUNNING


def test_require_approval_away_from_a_side_effect_holds_the_next_one(team):
    policy(team, "streak", "run.tool_failures_in_a_row >= 1", action="require_approval")
    run, _lease = make_running(team)
    permit(run, "c1", arguments={"q": 1})
    result(run, "c1", ExecutionState.FAILED)
    read, _ = permit(run, "c2", arguments={"q": 2})  # not a side effect: runs
    assert read.execution_state == ExecutionState.PERMITTED
    held, _ = permit(run, "c3", side_effect="write", arguments={"q": 3})
    assert held.execution_state == ExecutionState.AWAITING_APPROVAL
    assert Approval.objects.get(execution_record=held).rule_name == "streak"


def test_an_outbox_item_is_held(team):
    from runs import services
    from tests.support.scenarios import AGENT

    policy(
        team,
        "no-mail",
        'event.type == "outbox.enqueue" && call.destination_host == "example.org"',
        action="require_approval",
    )
    run, _lease = make_running(team)
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="email",
        destination="someone@example.org",
        payload={"subject": "hi", "body": "x"},
        idempotency_key="k1",
        actor=AGENT,
    )
    assert item.status == "awaiting_approval"
    assert Approval.objects.get(outbox_item=item).rule_name == "no-mail"


def test_side_effects_a_minute(team):
    policy(team, "burst", "run.side_effects_last_minute > 2")
    run, _lease = make_running(team)
    permit(run, "c1", side_effect="write", arguments={"n": 1})
    permit(run, "c2", side_effect="write", arguments={"n": 2})
    with pytest.raises(RunNotRunning):
        permit(run, "c3", side_effect="write", arguments={"n": 3})
    assert "run.side_effects_last_minute=3" in StopRequest.objects.get(run=run).note


def test_spend_in_an_events_batch_stops_the_run(team):
    policy(team, "spend", "run.cost_usd > 1.0")
    run, _lease = make_running(team)
    answers = batch(
        run,
        {
            "event_id": "u1",
            "type": "usage",
            "model": "x",
            "input_tokens": 1,
            "output_tokens": 1,
            "cost_usd": 0.75,
        },
    )
    assert answers[0].status == "accepted"
    assert reload(run).status == RunStatus.RUNNING
    batch(
        run,
        {
            "event_id": "u2",
            "type": "usage",
            "model": "x",
            "input_tokens": 1,
            "output_tokens": 1,
            "cost_usd": 0.5,
        },
    )
    run = reload(run)
    assert run.stop_reason == "policy_violation"
    stop = StopRequest.objects.get(run=run)
    assert "run.cost_usd=1.25" in stop.note
    assert PolicyHit.objects.get(run=run).event_type == "usage"


def test_steps_in_an_events_batch(team):
    policy(team, "steps", 'run.steps >= 3 && event.type == "step.started"')
    run, _lease = make_running(team)
    batch(
        run,
        {"event_id": "s1", "type": "step.started", "key": "a", "name": "a"},
        {"event_id": "s2", "type": "step.started", "key": "b", "name": "b"},
    )
    assert reload(run).status == RunStatus.RUNNING
    batch(run, {"event_id": "s3", "type": "step.started", "key": "c", "name": "c"})
    assert reload(run).stop_reason == "policy_violation"


def test_scope_globs(team):
    policy(team, "loop", "call.repeats >= 2", agent_glob="other-*")
    policy(team, "only-mail", "call.repeats >= 2", tool_glob="mail.*")
    run, _lease = make_running(team)
    permit(run, "c1")
    permit(run, "c2")
    assert reload(run).status == RunStatus.RUNNING


def test_a_disabled_policy_does_nothing(team):
    policy(team, "loop", "call.repeats >= 1", enabled=False)
    run, _lease = make_running(team)
    permit(run, "c1")
    assert reload(run).status == RunStatus.RUNNING
