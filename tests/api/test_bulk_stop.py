"""POST /api/v1/runs/stop/ — bulk stop and its preview (DESIGN §12)."""

from __future__ import annotations

import pytest

from runs.models import BulkStop, LedgerEntry, RunStatus, StopRequest
from runs.tokens import api_token_create
from tests.support.accounts import IssuedToken
from tests.support.scenarios import make_run, make_running, reload

pytestmark = pytest.mark.django_db

BULK = "/api/v1/runs/stop/"


def test_dry_run_answers_the_preview_and_stops_nothing(api, team, reviewer_token):
    make_running(team)
    make_running(team)
    make_run(team)
    ledger_before = LedgerEntry.objects.count()
    response = api.post(BULK, {"team": "acme", "dry_run": True}, reviewer_token)
    assert response.status_code == 200
    body = response.json()
    assert body["dry_run"] is True
    assert (body["matching"], body["will_stop"]) == (3, 3)
    assert body["by_status"] == {"running": 2, "pending": 1}
    assert body["limit"] == 10_000 and body["needs_confirm"] is False
    assert LedgerEntry.objects.count() == ledger_before
    assert not StopRequest.objects.exists()


def test_a_bulk_stop_answers_one_result_per_run_and_a_retry_the_same(api, team, reviewer_token):
    first, _ = make_running(team)
    second, _ = make_running(team)
    body = {"status": "running", "reason": "user_stop", "note": "fleet", "idempotency_key": "k1"}
    response = api.post(BULK, body, reviewer_token)
    assert response.status_code == 201
    answer = response.json()
    assert answer["bulk_id"].startswith("bulk_")
    assert (answer["requested"], answer["requested_by"], answer["counts"]) == (
        2,
        "reviewer-bot",
        {"stopped": 2},
    )
    assert answer["filter"] == {"status": "running"}
    results = {result["run_id"]: result for result in answer["results"]}
    assert set(results) == {first.pk, second.pk}
    for result in results.values():
        assert (result["outcome"], result["status"], result["stop_epoch"]) == (
            "stopped",
            "cancel_requested",
            2,
        )
        assert result["stop_request_id"] == StopRequest.objects.get(run_id=result["run_id"]).pk
    again = api.post(BULK, body, reviewer_token)
    assert again.status_code == 200
    assert again.json()["bulk_id"] == answer["bulk_id"]
    assert again.json()["results"] == answer["results"]
    assert BulkStop.objects.count() == 1


def test_filters_select_by_agent_and_ids(api, team, reviewer_token, system):
    from runs import services

    other_agent = services.run_create(team=team, title="t", agent="mail-bot", actor=system)
    report, _ = make_running(team)
    by_agent = api.post(BULK, {"agent": "mail-bot"}, reviewer_token).json()
    assert [result["run_id"] for result in by_agent["results"]] == [other_agent.pk]
    assert reload(report).status == RunStatus.RUNNING
    by_ids = api.post(BULK, {"ids": [report.pk, "run_000000000000"]}, reviewer_token).json()
    assert {result["run_id"]: result["outcome"] for result in by_ids["results"]} == {
        report.pk: "stopped",
        "run_000000000000": "not_found",
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "filter"),
        ({"status": "nope"}, "status"),
        ({"team": "globex"}, "team"),
        ({"ids": "run_1"}, "ids"),
        ({"ids": ["run_\u0000"]}, "ids[0]"),  # the item: the schema gives its pattern
        ({"all": True, "reason": "manual_takeover"}, "reason"),
        ({"all": True, "reason": "drain_deadline"}, "reason"),
    ],
)
def test_bad_filters_are_400_naming_the_field(api, team, other_team, reviewer_token, body, field):
    make_running(team)
    response = api.post(BULK, body, reviewer_token)
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert not StopRequest.objects.exists()


def test_runs_of_other_teams_are_never_touched(
    api, team, other_team, reviewer_token, outsider_token
):
    ours, _ = make_running(team)
    theirs, _ = make_running(other_team)
    answer = api.post(BULK, {"all": True, "ids": [theirs.pk]}, reviewer_token).json()
    assert {result["run_id"]: result["outcome"] for result in answer["results"]} == {
        theirs.pk: "not_found"
    }
    everything = api.post(BULK, {"all": True}, reviewer_token).json()
    assert [result["run_id"] for result in everything["results"]] == [ours.pk]
    assert reload(theirs).status == RunStatus.RUNNING
    preview = api.post(BULK, {"all": True, "dry_run": True}, reviewer_token).json()
    assert preview["matching"] == 1  # the other team's run is not even counted


def test_agent_tokens_stop_only_their_teams_runs_for_their_reasons(
    api, team, other_team, agent_token
):
    ours, _ = make_running(team)
    theirs, _ = make_running(other_team)
    refused = api.post(BULK, {"all": True, "reason": "user_stop"}, agent_token)
    assert refused.status_code == 403
    assert "budget_exhausted" in refused.json()["detail"]
    assert reload(ours).status == RunStatus.RUNNING
    answer = api.post(BULK, {"all": True, "reason": "budget_exhausted"}, agent_token)
    assert answer.status_code == 201
    assert [result["run_id"] for result in answer.json()["results"]] == [ours.pk]
    assert reload(theirs).status == RunStatus.RUNNING


def test_admin_kill_is_not_allowed_on_teams_where_the_caller_is_not_an_admin(
    api, client, team, other_team, alice
):
    from runs.models import Membership, Role

    Membership.objects.create(user=alice, team=other_team, role=Role.REVIEWER)
    ours, _ = make_running(team)
    theirs, _ = make_running(other_team)
    client.force_login(alice)
    answer = api.post(BULK, {"status": "running", "reason": "admin_kill"}).json()
    outcomes = {result["run_id"]: result for result in answer["results"]}
    assert outcomes[ours.pk]["outcome"] == "stopped"
    assert outcomes[theirs.pk]["outcome"] == "not_allowed"
    assert "admin" in outcomes[theirs.pk]["detail"]
    assert reload(theirs).status == RunStatus.RUNNING


def test_viewers_may_not_bulk_stop(api, client, team, charlie):
    run, _ = make_running(team)
    client.force_login(charlie)
    assert api.post(BULK, {"all": True}).status_code == 403
    assert reload(run).status == RunStatus.RUNNING


def test_more_than_the_limit_needs_confirm(api, team, reviewer_token, settings):
    settings.SAFESTOP_BULK_STOP_LIMIT = 1
    make_running(team)
    make_running(team)
    refused = api.post(BULK, {"status": "running"}, reviewer_token)
    assert refused.status_code == 400
    body = refused.json()
    assert (body["error"], body["would_stop"], body["limit"]) == ("bulk_too_large", 2, 1)
    assert "confirm" in body["detail"]
    assert not StopRequest.objects.exists()
    confirmed = api.post(BULK, {"status": "running", "confirm": True}, reviewer_token)
    assert confirmed.status_code == 201
    assert confirmed.json()["counts"] == {"stopped": 2}


def test_the_bulk_stop_is_in_the_schema(client):
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/runs/stop/"]["post"]
    assert operation["operationId"] == "runs_bulk_stop"
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    request = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    assert {"agent", "team", "status", "tool", "ids", "reason", "dry_run", "confirm"} <= set(
        request["properties"]
    )
    assert {"200", "201", "400", "403"} <= set(operation["responses"])


def test_a_confirm_naming_the_preview_stops_exactly_its_runs(api, team, reviewer_token):
    shown = [make_running(team)[0] for _ in range(2)]
    preview = api.post(BULK, {"status": "running", "dry_run": True}, reviewer_token).json()
    assert preview["preview_id"].startswith("bprev_")
    assert sorted(preview["ids"]) == sorted(run.pk for run in shown)
    newcomer, _ = make_running(team)
    response = api.post(
        BULK, {"preview_id": preview["preview_id"], "idempotency_key": "p1"}, reviewer_token
    )
    assert response.status_code == 201
    answer = response.json()
    assert answer["preview_id"] == preview["preview_id"]
    assert answer["new_since_preview"] == 1
    assert sorted(result["run_id"] for result in answer["results"]) == sorted(r.pk for r in shown)
    # Stopped means requested until each run has drained: its worker is still running.
    assert {result["state"] for result in answer["results"]} == {"requested"}
    assert reload(newcomer).status == RunStatus.RUNNING


def test_a_preview_of_someone_else_is_404_and_a_stale_one_409(api, team, reviewer_token, settings):
    make_running(team)
    preview = api.post(BULK, {"team": "acme", "dry_run": True}, reviewer_token).json()
    _other, other_raw = api_token_create(team_slug=team.slug, name="another-bot", role="reviewer")
    response = api.post(BULK, {"preview_id": preview["preview_id"]}, IssuedToken(_other, other_raw))
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    settings.SAFESTOP_BULK_PREVIEW_SECONDS = 0
    response = api.post(BULK, {"preview_id": preview["preview_id"]}, reviewer_token)
    assert response.status_code == 409
    assert response.json()["error"] == "preview_expired"
    assert not StopRequest.objects.exists()
