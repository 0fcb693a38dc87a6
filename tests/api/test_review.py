"""GET /stop-packet/, /stop-packets/{epoch}/; POST /resolutions/, /steering/."""

from __future__ import annotations

import pytest

from runs.models import SteeringMessage
from tests.support.api import lease_body, stop, url
from tests.support.scenarios import make_run, make_running

pytestmark = pytest.mark.django_db

DESIGN_PACKET_FIELDS = {
    "run_id",
    "stop_epoch",
    "stop_reason",
    "requested_by",
    "requested_at",
    "stopped_at",
    "state",
    "lease_released",
    "resume_from",
    "frozen_outbox_ids",
    "in_flight_outbox_ids",
    "completed_steps",
    "pending_steps",
    "artifacts",
    "unconfirmed_side_effects",
    "unapplied_steering",
    "late_writes_rejected",
}


@pytest.fixture
def dirty_run(api, team, agent_token, reviewer_token):
    """A run stopped while a write was in flight: stopped_dirty with one unknown tool call."""
    run, lease = make_running(team)
    api.post(
        url(run, "permits/"),
        {
            "epoch": 1,
            "tool_call_id": "call_9",
            "tool": "deploy",
            "side_effect": "write",
            "operation_id": "deploy-77",
        },
        agent_token,
    )
    api.post(url(run, "cancel/"), {"reason": "manual_takeover"}, reviewer_token)
    api.post(url(run, "drained/"), lease_body(lease), agent_token)
    return run


def test_stop_packet_has_the_design_fields(api, dirty_run, agent_token):
    response = api.get(url(dirty_run, "stop-packet/"), agent_token)
    assert response.status_code == 200
    packet = response.json()
    assert DESIGN_PACKET_FIELDS <= set(packet)
    assert (packet["state"], packet["stop_epoch"], packet["stop_reason"]) == (
        "stopped_dirty",
        2,
        "manual_takeover",
    )
    assert [item["tool_call_id"] for item in packet["unconfirmed_side_effects"]] == ["call_9"]
    assert packet["resolutions"] == []
    assert api.get(url(dirty_run, "stop-packets/2/"), agent_token).json()["stop_epoch"] == 2


def test_no_stop_packet_yet_is_404(api, team, agent_token):
    run, _ = make_running(team)
    response = api.get(url(run, "stop-packet/"), agent_token)
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert api.get(url(run, "stop-packets/1/"), agent_token).status_code == 404
    assert api.get(url(run, "stop-packets/99999999999999999999/"), agent_token).status_code == 404


def test_an_older_packet_stays_reachable_after_a_resume(api, team, reviewer_token):
    run = make_run(team)
    stop(run)
    api.post(url(run, "resume/"), {}, reviewer_token)
    stop(run)
    assert api.get(url(run, "stop-packet/"), reviewer_token).json()["stop_epoch"] == 4
    assert api.get(url(run, "stop-packets/2/"), reviewer_token).json()["stop_epoch"] == 2


def test_another_teams_packet_is_404(api, other_team, agent_token):
    run = make_run(other_team)
    stop(run)
    assert api.get(url(run, "stop-packet/"), agent_token).status_code == 404


def test_resolving_the_last_unknown_hands_off_and_a_repeat_is_200(api, dirty_run, reviewer_token):
    body = {
        "target": "tool_call",
        "id": "call_9",
        "decision": "not_applied",
        "evidence": "deploy-77 never started",
    }
    first = api.post(url(dirty_run, "resolutions/"), body, reviewer_token)
    assert first.status_code == 201
    assert first.json() == {
        "target": "tool_call",
        "id": "call_9",
        "decision": "not_applied",
        "created": True,
        "run_status": "handed_off",
    }
    again = api.post(url(dirty_run, "resolutions/"), body, reviewer_token)
    assert again.status_code == 200
    assert again.json()["created"] is False
    packet = api.get(url(dirty_run, "stop-packet/"), reviewer_token).json()
    assert [(r["id"], r["decision"]) for r in packet["resolutions"]] == [("call_9", "not_applied")]


def test_a_different_decision_on_a_resolved_target_is_409(api, dirty_run, reviewer_token):
    body = {
        "target": "tool_call",
        "id": "call_9",
        "decision": "applied",
        "evidence": "seen in console",
    }
    api.post(url(dirty_run, "resolutions/"), body, reviewer_token)
    response = api.post(
        url(dirty_run, "resolutions/"), {**body, "decision": "compensated"}, reviewer_token
    )
    assert response.status_code == 409
    assert response.json()["error"] == "illegal_transition"
    assert "status" in response.json() and "stop_epoch" in response.json()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"target": "nothing"}, "target"),
        ({"decision": "maybe"}, "decision"),
        ({"evidence": ""}, "evidence"),
        ({"id": None}, "id"),
        ({"target": "outbox", "id": "box-of-stuff"}, "id"),
    ],
)
def test_resolution_bad_input(api, dirty_run, reviewer_token, change, field):
    body = {
        "target": "tool_call",
        "id": "call_9",
        "decision": "applied",
        "evidence": "seen",
        **change,
    }
    response = api.post(url(dirty_run, "resolutions/"), body, reviewer_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_resolving_an_unknown_target_is_404(api, dirty_run, reviewer_token):
    body = {"target": "outbox", "id": "outbox_424242", "decision": "applied", "evidence": "seen"}
    assert api.post(url(dirty_run, "resolutions/"), body, reviewer_token).status_code == 404


def test_agents_cannot_resolve(api, dirty_run, agent_token):
    body = {"target": "tool_call", "id": "call_9", "decision": "applied", "evidence": "trust me"}
    assert api.post(url(dirty_run, "resolutions/"), body, agent_token).status_code == 403


def test_steering_is_queued(api, team, reviewer_token):
    run, _ = make_running(team)
    response = api.post(url(run, "steering/"), {"text": "use the staging cluster"}, reviewer_token)
    assert response.status_code == 201
    assert (response.json()["status"], response.json()["author"]) == ("queued", "reviewer-bot")
    assert SteeringMessage.objects.get().text == "use the staging cluster"


def test_steering_bad_input_wrong_role_finished_run(
    api, client, team, agent_token, reviewer_token, charlie
):
    run, _ = make_running(team)
    assert api.post(url(run, "steering/"), {"text": ""}, reviewer_token).json()["field"] == "text"
    assert (
        api.post(url(run, "steering/"), {"text": "x" * 10_001}, reviewer_token).status_code == 400
    )
    assert api.post(url(run, "steering/"), {"text": "go"}, agent_token).status_code == 403
    api.post(
        url(run, "events/"),
        {"epoch": 1, "events": [{"event_id": "d", "type": "run.completed"}]},
        agent_token,
    )
    finished = api.post(url(run, "steering/"), {"text": "too late"}, reviewer_token)
    assert finished.status_code == 409
    assert finished.json()["status"] == "completed"
