"""POST /permits/ and /tool-calls/{tool_call_id}/result/."""

from __future__ import annotations

import pytest

from runs.models import ExecutionRecord
from tests.support.api import stop, url
from tests.support.scenarios import make_run, make_running, reload

pytestmark = pytest.mark.django_db


def permit(tool_call_id="call_1", epoch=1, **extra):
    return {
        "epoch": epoch,
        "tool_call_id": tool_call_id,
        "tool": "deploy",
        "side_effect": "write",
        "arguments": {"service": "api"},
        **extra,
    }


def test_permit_is_201_and_a_retry_answers_the_same_permit_with_200(api, team, agent_token):
    run, _ = make_running(team)
    first = api.post(
        url(run, "permits/"), permit(idempotency_key="k-1", operation_id="deploy-77"), agent_token
    )
    again = api.post(
        url(run, "permits/"), permit(idempotency_key="k-1", operation_id="deploy-77"), agent_token
    )
    assert first.status_code == 201
    assert again.status_code == 200
    assert first.json() == again.json()
    assert {key: first.json()[key] for key in ("tool_call_id", "epoch")} == {
        "tool_call_id": "call_1",
        "epoch": 1,
    }
    assert first.json()["permit_id"].startswith("permit_")
    assert ExecutionRecord.objects.filter(run=run).count() == 1


def test_permit_after_a_stop_is_refused_with_the_current_status_and_epoch(api, team, agent_token):
    run, _ = make_running(team)
    stop(run)
    response = api.post(url(run, "permits/"), permit(), agent_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["status"], response.json()["stop_epoch"]) == (
        "stale_epoch",
        "cancel_requested",
        2,
    )
    assert not ExecutionRecord.objects.filter(run=run).exists()
    assert reload(run).late_writes_rejected == 1


def test_permit_before_the_lease_is_409_run_not_running(api, team, agent_token):
    run = make_run(team)
    response = api.post(url(run, "permits/"), permit(), agent_token)
    assert response.status_code == 409
    assert response.json()["error"] == "run_not_running"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tool_call_id": None}, "tool_call_id"),
        ({"side_effect": "maybe"}, "side_effect"),
        ({"epoch": 10**30}, "epoch"),
        ({"epoch": -1}, "epoch"),
        ({"epoch": "one"}, "epoch"),
        ({"recovery_policy": "pray"}, "recovery_policy"),
        ({"tool": "t" * 121}, "tool"),
    ],
)
def test_permit_bad_input_names_the_field(api, team, agent_token, change, field):
    run, _ = make_running(team)
    response = api.post(url(run, "permits/"), permit(**change), agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_permits_need_an_api_token_and_the_runs_team(
    api, client, team, other_team, bob, outsider_token
):
    run, _ = make_running(team)
    assert api.post(url(run, "permits/"), permit(), outsider_token).status_code == 404
    client.force_login(bob)
    assert api.post(url(run, "permits/"), permit()).status_code == 403


def test_tool_result_is_recorded(api, team, agent_token):
    run, _ = make_running(team)
    api.post(url(run, "permits/"), permit(), agent_token)
    response = api.post(
        url(run, "tool-calls/call_1/result/"),
        {"execution_state": "succeeded", "operation_id": "deploy-77", "observation": "ok"},
        agent_token,
    )
    assert response.status_code == 200
    assert (response.json()["execution_state"], response.json()["side_effect_state"]) == (
        "succeeded",
        "applied",
    )


def test_tool_result_after_the_stop_is_kept_as_a_fact(api, team, agent_token):
    run, _ = make_running(team)
    api.post(url(run, "permits/"), permit(), agent_token)
    stop(run)
    response = api.post(
        url(run, "tool-calls/call_1/result/"), {"execution_state": "failed"}, agent_token
    )
    assert response.status_code == 200
    assert response.json()["reported_after_stop"] is True
    assert response.json()["execution_state"] == "failed"


def test_tool_call_ids_with_a_slash_reach_their_result(api, team, agent_token):
    run, _ = make_running(team)
    api.post(url(run, "permits/"), permit("ns/call 1"), agent_token)
    response = api.post(
        url(run, "tool-calls/ns%2Fcall%201/result/"), {"execution_state": "succeeded"}, agent_token
    )
    assert response.status_code == 200
    assert response.json()["tool_call_id"] == "ns/call 1"


def test_tool_result_for_an_unpermitted_call_is_404(api, team, agent_token):
    run, _ = make_running(team)
    response = api.post(
        url(run, "tool-calls/never/result/"), {"execution_state": "succeeded"}, agent_token
    )
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"execution_state": "permitted"}, "execution_state"),
        ({}, "execution_state"),
        ({"execution_state": "failed", "output_truncated": "sometimes"}, "output_truncated"),
        ({"execution_state": "failed", "remote_cancel_state": "begged"}, "remote_cancel_state"),
        ({"execution_state": "failed", "operation_id": "o" * 201}, "operation_id"),
    ],
)
def test_tool_result_bad_input(api, team, agent_token, body, field):
    run, _ = make_running(team)
    api.post(url(run, "permits/"), permit(), agent_token)
    response = api.post(url(run, "tool-calls/call_1/result/"), body, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field
