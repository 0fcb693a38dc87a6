"""POST /lease/, /lease/heartbeat/, /lease/release/."""

from __future__ import annotations

import pytest

from tests.support.api import lease_body, stop, url
from tests.support.scenarios import make_run, make_running

pytestmark = pytest.mark.django_db


def test_acquire_answers_lease_id_epoch_and_expiry(api, team, agent_token):
    run = make_run(team)
    response = api.post(url(run, "lease/"), {"worker_id": "w-1", "ttl_seconds": 15}, agent_token)
    assert response.status_code == 201
    lease = response.json()
    assert lease["lease_id"].startswith("lease_")
    assert lease["epoch"] == 1
    assert lease["expires_at"]
    assert api.get(url(run), agent_token).json()["status"] == "running"


def test_acquire_while_held_is_409_lease_held_with_status_and_epoch(api, team, agent_token):
    run, _ = make_running(team)
    response = api.post(url(run, "lease/"), {"worker_id": "w-2"}, agent_token)
    assert response.status_code == 409
    assert response.json() == {
        **response.json(),
        "error": "lease_held",
        "status": "running",
        "stop_epoch": 1,
    }


def test_acquire_a_stopped_run_is_409_run_not_running(api, team, agent_token):
    run = make_run(team)
    stop(run)
    response = api.post(url(run, "lease/"), {"worker_id": "w"}, agent_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["status"], response.json()["stop_epoch"]) == (
        "run_not_running",
        "stopped_cleanly",
        2,
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "worker_id"),
        ({"worker_id": "w", "ttl_seconds": 0}, "ttl_seconds"),
        ({"worker_id": "w", "ttl_seconds": 10**400}, "ttl_seconds"),
        ({"worker_id": "w", "ttl_seconds": "soon"}, "ttl_seconds"),
    ],
)
def test_acquire_bad_input(api, team, agent_token, body, field):
    response = api.post(url(make_run(team), "lease/"), body, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_heartbeat_without_a_stop_has_no_signal(api, team, agent_token):
    run, lease = make_running(team)
    response = api.post(url(run, "lease/heartbeat/"), lease_body(lease), agent_token)
    assert response.status_code == 200
    assert response.json()["signal"] is None
    assert response.json()["expires_at"] > lease.expires_at.isoformat().replace("+00:00", "Z")[:19]


def test_heartbeat_after_a_stop_carries_the_signal_and_counts_as_the_ack(
    api, team, agent_token, reviewer_token
):
    run, lease = make_running(team)
    stop_request = api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token).json()[
        "stop_request"
    ]
    response = api.post(url(run, "lease/heartbeat/"), lease_body(lease), agent_token)
    assert response.status_code == 200
    signal = response.json()["signal"]
    assert {
        key: signal[key]
        for key in ("type", "reason", "requested_by", "stop_epoch", "stop_request_id")
    } == {
        "type": "cancel_requested",
        "reason": "user_stop",
        "requested_by": "reviewer-bot",
        "stop_epoch": 2,
        "stop_request_id": stop_request["id"],
    }
    assert api.get(url(run), agent_token).json()["status"] == "draining"


def test_heartbeat_at_a_wrong_epoch_is_409_stale_epoch(api, team, agent_token):
    run, lease = make_running(team)
    response = api.post(url(run, "lease/heartbeat/"), lease_body(lease, epoch=7), agent_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["status"], response.json()["stop_epoch"]) == (
        "stale_epoch",
        "running",
        1,
    )


def test_heartbeat_once_stopped_is_409_lease_revoked(api, team, agent_token):
    run, lease = make_running(team)
    stop(run)
    api.post(url(run, "drained/"), lease_body(lease), agent_token)
    response = api.post(url(run, "lease/heartbeat/"), lease_body(lease), agent_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["status"], response.json()["stop_epoch"]) == (
        "lease_revoked",
        "stopped_cleanly",
        2,
    )


def test_heartbeat_with_an_unknown_lease_is_404(api, team, agent_token):
    run, lease = make_running(team)
    response = api.post(
        url(run, "lease/heartbeat/"), {"lease_id": "lease_nope", "epoch": 1}, agent_token
    )
    assert response.status_code == 404


def test_release_interrupts_a_running_run_and_a_retry_answers_the_same(api, team, agent_token):
    run, lease = make_running(team)
    first = api.post(url(run, "lease/release/"), lease_body(lease), agent_token)
    again = api.post(url(run, "lease/release/"), lease_body(lease), agent_token)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert first.json()["status"] == "interrupted"
    assert first.json()["release_reason"] == "released"


def test_release_at_a_wrong_epoch_is_409(api, team, agent_token):
    run, lease = make_running(team)
    response = api.post(url(run, "lease/release/"), lease_body(lease, epoch=0), agent_token)
    assert response.status_code == 409
    assert response.json()["error"] == "stale_epoch"


def test_lease_endpoints_need_an_api_token(api, client, team, bob):
    run = make_run(team)
    client.force_login(bob)
    response = api.post(url(run, "lease/"), {"worker_id": "w"})
    assert response.status_code == 403
    assert "token" in response.json()["detail"]


def test_another_teams_lease_is_404(api, other_team, agent_token):
    run, lease = make_running(other_team)
    assert api.post(url(run, "lease/heartbeat/"), lease_body(lease), agent_token).status_code == 404
    assert api.post(url(run, "lease/"), {"worker_id": "w"}, agent_token).status_code == 404


def test_release_with_suspend_keeps_the_approval_and_the_next_lease_goes_on(api, team, agent_token):
    run, lease = make_running(team)
    held = api.post(
        url(run, "permits/"),
        {
            "epoch": lease.epoch,
            "tool_call_id": "call_1",
            "tool": "refund",
            "side_effect": "write",
            "arguments": {"order": "1042"},
            "needs_approval": True,
        },
        agent_token,
    )
    assert held.status_code == 202
    released = api.post(
        url(run, "lease/release/"),
        {**lease_body(lease), "suspend": True, "reason": "waiting_for_approval"},
        agent_token,
    )
    assert released.status_code == 200
    assert released.json()["status"] == "suspended"
    approval = api.get(f"/api/v1/approvals/{held.json()['approval']['id']}/", agent_token)
    assert approval.json()["status"] == "waiting"
    again = api.post(url(run, "lease/"), {"worker_id": "w-2"}, agent_token)
    assert again.status_code == 201 and again.json()["epoch"] == lease.epoch


def test_release_with_suspend_while_a_call_is_in_flight_is_409_and_keeps_the_lease(
    api, team, agent_token
):
    run, lease = make_running(team)
    api.post(
        url(run, "permits/"),
        {
            "epoch": lease.epoch,
            "tool_call_id": "c1",
            "tool": "lookup",
            "side_effect": "none",
            "arguments": {},
        },
        agent_token,
    )
    response = api.post(
        url(run, "lease/release/"), {**lease_body(lease), "suspend": True}, agent_token
    )
    assert response.status_code == 409
    assert response.json()["error"] == "illegal_transition"
    assert "c1" in response.json()["detail"]
    beat = api.post(url(run, "lease/heartbeat/"), lease_body(lease), agent_token)
    assert beat.status_code == 200, "the lease is still the worker's"


def test_release_with_a_suspend_that_is_not_a_boolean_is_400(api, team, agent_token):
    run, lease = make_running(team)
    response = api.post(
        url(run, "lease/release/"), {**lease_body(lease), "suspend": "yes"}, agent_token
    )
    assert response.status_code == 400
    assert response.json()["field"] == "suspend"
