"""POST/GET /api/v1/runs/ and GET /api/v1/runs/{id}/."""

from __future__ import annotations

import pytest

from api.models import Denial
from runs.models import Step
from tests.support.api import url
from tests.support.scenarios import make_run, make_running

pytestmark = pytest.mark.django_db


def test_create_answers_201_with_id_status_and_epoch(api, agent_token):
    body = {
        "title": "Quarterly report",
        "agent": "report-bot",
        "steps": [{"key": "plan"}, {"key": "send", "name": "Send it", "kind": "external_action"}],
        "budget": {"max_seconds": 600, "max_tool_calls": 20},
    }
    response = api.post("/api/v1/runs/", body, agent_token)
    assert response.status_code == 201
    run = response.json()
    assert run["status"] == "pending"
    assert run["stop_epoch"] == 1
    assert run["id"].startswith("run_")
    assert run["team"] == "acme"
    assert run["budget"] == {
        "max_seconds": 600,
        "max_tool_calls": 20,
        "tool_calls_used": 0,
        "max_cost_usd": None,
        "max_tokens": None,
    }
    assert run["created_by"] == "agent-1"
    assert list(Step.objects.filter(run_id=run["id"]).values_list("key", "kind")) == [
        ("plan", "model_call"),
        ("send", "external_action"),
    ]


def test_a_retried_create_with_the_same_idempotency_key_returns_the_first_run(
    api, agent_token, outsider_token
):
    body = {
        "title": "Nightly export",
        "agent": "export-bot",
        "idempotency_key": "export-2026-11-30",
    }
    first = api.post("/api/v1/runs/", body, agent_token)
    again = api.post("/api/v1/runs/", body, agent_token)
    other_team = api.post("/api/v1/runs/", body, outsider_token)
    assert (first.status_code, again.status_code, other_team.status_code) == (201, 200, 201)
    assert again.json()["id"] == first.json()["id"]
    assert other_team.json()["id"] != first.json()["id"]  # keys are per team


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"agent": "a"}, "title"),
        ({"title": ["not", "text"], "agent": "a"}, "title"),
        ({"title": "t", "agent": "a" * 121}, "agent"),
        ({"title": "t", "agent": "a", "steps": [{"key": "x"}, {"key": "x"}]}, "steps"),
        ({"title": "t", "agent": "a", "steps": [{"name": "no key"}]}, "steps[0].key"),
        (
            {"title": "t", "agent": "a", "steps": [{"key": "x", "kind": "teleport"}]},
            "steps[0].kind",
        ),
        ({"title": "t", "agent": "a", "budget": {"max_seconds": -1}}, "budget.max_seconds"),
        (
            {"title": "t", "agent": "a", "budget": {"max_tool_calls": 10**40}},
            "budget.max_tool_calls",
        ),
    ],
)
def test_create_with_bad_input_names_the_field(api, agent_token, body, field):
    response = api.post("/api/v1/runs/", body, agent_token)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert response.json()["field"] == field


def test_session_users_cannot_create_runs(api, client, bob):
    client.force_login(bob)
    response = api.post("/api/v1/runs/", {"title": "t", "agent": "a"})
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


def test_list_shows_only_the_callers_team(api, team, other_team, agent_token, outsider_token):
    mine, theirs = make_run(team), make_run(other_team)
    ids = [run["id"] for run in api.get("/api/v1/runs/", agent_token).json()["results"]]
    assert ids == [mine.pk]
    ids = [run["id"] for run in api.get("/api/v1/runs/", outsider_token).json()["results"]]
    assert ids == [theirs.pk]


def test_list_filters_by_status_and_pages_with_a_cursor(api, team, agent_token, reviewer_token):
    runs = [make_run(team) for _ in range(3)]
    api.post(url(runs[0], "cancel/"), {"reason": "user_stop"}, reviewer_token)
    stopped = api.get("/api/v1/runs/", agent_token, status="stopped_cleanly").json()["results"]
    assert [run["id"] for run in stopped] == [runs[0].pk]
    first = api.get("/api/v1/runs/", agent_token, limit=2).json()
    assert [run["id"] for run in first["results"]] == [runs[2].pk, runs[1].pk]
    second = api.client.get(first["next"], **agent_token.header).json()
    assert [run["id"] for run in second["results"]] == [runs[0].pk]


def test_list_with_an_unknown_status_is_400(api, agent_token):
    response = api.get("/api/v1/runs/", agent_token, status="exploded")
    assert response.status_code == 400
    assert response.json()["field"] == "status"


def test_viewer_session_reads_runs_of_their_team(api, client, team, charlie):
    run = make_run(team)
    client.force_login(charlie)
    assert api.get(url(run)).json()["id"] == run.pk
    assert [r["id"] for r in api.get("/api/v1/runs/").json()["results"]] == [run.pk]


def test_staff_read_every_team(api, client, team, other_team, django_user_model):
    runs = {make_run(team).pk, make_run(other_team).pk}
    client.force_login(django_user_model.objects.create_user("root", is_staff=True))
    assert {r["id"] for r in api.get("/api/v1/runs/").json()["results"]} == runs


def test_detail(api, team, agent_token):
    run = make_run(team)
    body = api.get(url(run), agent_token).json()
    assert {
        key: body[key] for key in ("id", "title", "agent", "status", "stop_epoch", "stop_reason")
    } == {
        "id": run.pk,
        "title": "Quarterly report",
        "agent": "report-bot",
        "status": "pending",
        "stop_epoch": 1,
        "stop_reason": None,
    }


def test_detail_returns_the_result_given_to_run_complete(api, team, agent_token):
    completed, lease = make_running(team)
    result = {"deployed": "1.4.2", "checks": [1, 2], "note": None}
    answer = api.post(
        url(completed, "events/"),
        {
            "epoch": lease.epoch,
            "events": [{"event_id": "e1", "type": "run.completed", "result": result}],
        },
        agent_token,
    )
    assert answer.json()["accepted"] == 1
    body = api.get(url(completed), agent_token).json()
    assert (body["status"], body["result"], body["failure"]) == ("completed", result, None)

    failed, lease = make_running(team)
    api.post(
        url(failed, "events/"),
        {
            "epoch": lease.epoch,
            "events": [{"event_id": "e1", "type": "run.failed", "error": "boom"}],
        },
        agent_token,
    )
    body = api.get(url(failed), agent_token).json()
    assert (body["status"], body["result"], body["failure"]) == ("failed", None, {"error": "boom"})


def test_another_teams_run_is_a_404_like_a_missing_one_and_is_counted(api, other_team, agent_token):
    theirs = make_run(other_team)
    response = api.get(url(theirs), agent_token)
    missing = api.get(url("run_000000000000"), agent_token)
    assert response.status_code == missing.status_code == 404
    assert response.json()["error"] == missing.json()["error"] == "not_found"
    denial = Denial.objects.get()
    assert (denial.reason, denial.credential, denial.team_slug) == (
        "wrong_team",
        "token:agent-1",
        "acme",
    )
