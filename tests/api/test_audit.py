"""GET /ledger/, /metrics/stop-quality/, /security/denials/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from api.models import Denial
from tests.support.api import stop, url
from tests.support.scenarios import make_run, make_running

pytestmark = pytest.mark.django_db

LEDGER_FIELDS = {
    "seq",
    "at",
    "run_id",
    "actor",
    "actor_kind",
    "action",
    "reason",
    "payload",
    "hash",
}


def test_ledger_entries_name_who_did_it(api, team, reviewer_token):
    run = make_run(team)
    api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token)
    entries = api.get(
        "/api/v1/ledger/", reviewer_token, run=run.pk, action="run.stop_requested"
    ).json()["results"]
    assert len(entries) == 1
    entry = entries[0]
    assert LEDGER_FIELDS <= set(entry)
    assert (entry["run_id"], entry["actor"], entry["actor_kind"], entry["reason"]) == (
        run.pk,
        "reviewer-bot",
        "api_client",
        "user_stop",
    )
    assert len(entry["hash"]) == 64


def test_ledger_is_scoped_to_the_readers_teams(
    api, client, team, other_team, reviewer_token, django_user_model
):
    mine, theirs = make_run(team), make_run(other_team)
    run_ids = {
        entry["run_id"] for entry in api.get("/api/v1/ledger/", reviewer_token).json()["results"]
    }
    assert mine.pk in run_ids and theirs.pk not in run_ids
    client.force_login(django_user_model.objects.create_user("root", is_staff=True))
    run_ids = {entry["run_id"] for entry in api.get("/api/v1/ledger/").json()["results"]}
    assert {mine.pk, theirs.pk} <= run_ids


def test_ledger_filters_by_actor_and_time(api, team, reviewer_token):
    run = make_run(team)
    stop(run)
    by_test = api.get("/api/v1/ledger/", reviewer_token, actor="test").json()["results"]
    assert by_test and {entry["actor"] for entry in by_test} == {"test"}
    future = (timezone.now() + timedelta(hours=1)).isoformat()
    assert api.get("/api/v1/ledger/", reviewer_token, since=future).json()["results"] == []
    assert api.get("/api/v1/ledger/", reviewer_token, until=future).json()["results"]


def test_ledger_is_for_reviewers(api, client, team, agent_token, charlie):
    assert api.get("/api/v1/ledger/", agent_token).status_code == 403
    client.force_login(charlie)
    assert api.get("/api/v1/ledger/").status_code == 403


@pytest.mark.parametrize(
    "params",
    [
        {"since": "yesterday"},
        {"since": "2030-01-01T00:00:00Z", "until": "2020-01-01T00:00:00Z"},
        {"actor": "a" * 151},
        {"cursor": "garbage"},
    ],
)
def test_ledger_bad_query(api, team, reviewer_token, params):
    response = api.get("/api/v1/ledger/", reviewer_token, **params)
    assert response.status_code in (400, 404)
    assert response.json()["error"] in ("invalid", "not_found")


def test_stop_quality_defaults_to_the_last_day_and_counts_the_teams_stops(
    api, team, other_team, agent_token
):
    run, _ = make_running(team)
    stop(run)
    stop(make_run(other_team))
    response = api.get("/api/v1/metrics/stop-quality/", agent_token)
    assert response.status_code == 200
    figures = response.json()
    assert figures["stops"] == 1
    assert figures["side_effect_leakage"]["total"] == 0
    assert set(figures) >= {
        "stop_latency",
        "side_effect_leakage",
        "late_writes_rejected",
        "interruptions_recovered_cleanly",
        "handoff_completion",
    }
    since, until = figures["period"]["since"], figures["period"]["until"]
    assert since < until


def test_stop_quality_period_and_bad_period(api, team, agent_token):
    stop(make_run(team))
    old = api.get(
        "/api/v1/metrics/stop-quality/",
        agent_token,
        since="2020-01-01T00:00:00Z",
        until="2020-01-02T00:00:00Z",
    )
    assert old.json()["stops"] == 0
    assert (
        api.get(
            "/api/v1/metrics/stop-quality/", agent_token, until="0001-01-01T00:00:01Z"
        ).status_code
        == 200
    )
    bad = api.get(
        "/api/v1/metrics/stop-quality/",
        agent_token,
        since="2020-01-02T00:00:00Z",
        until="2020-01-01T00:00:00Z",
    )
    assert bad.status_code == 400
    assert bad.json()["field"] == "since"


def test_denied_attempts_are_counted_and_listed_for_admins(
    api, client, team, other_team, agent_token, alice, django_user_model
):
    theirs = make_run(other_team)
    mine = make_run(team)
    for _ in range(3):
        api.get(url(theirs), agent_token)  # wrong team
    api.post(url(mine, "takeover/"), {}, agent_token)  # wrong role
    api.client.get("/api/v1/runs/", HTTP_AUTHORIZATION="Bearer ss_not-a-real-token")  # bad token
    client.force_login(alice)
    listing = api.get("/api/v1/security/denials/").json()
    assert listing["by_reason"] == {
        "wrong_team": 3,
        "wrong_role": 1,
    }  # bad tokens belong to no team
    wrong_team = next(row for row in listing["results"] if row["reason"] == "wrong_team")
    assert (wrong_team["count"], wrong_team["credential"], wrong_team["route"]) == (
        3,
        "token:agent-1",
        "api/v1/runs/<str:run_id>/",
    )
    client.force_login(django_user_model.objects.create_user("root", is_staff=True))
    assert api.get("/api/v1/security/denials/").json()["by_reason"] == {
        "wrong_team": 3,
        "wrong_role": 1,
        "bad_token": 1,
    }


def test_a_revoked_token_is_named_in_the_denials(api, agent_token):
    from runs.actors import Actor
    from runs.tokens import api_token_revoke

    api_token_revoke(token_id=agent_token.token.pk, actor=Actor.system("test"))
    assert api.get("/api/v1/runs/", agent_token).status_code == 401
    denial = Denial.objects.get()
    assert (denial.reason, denial.credential, denial.team_slug) == (
        "bad_token",
        "revoked token:agent-1",
        "acme",
    )


def test_denials_are_for_admins_only(api, client, reviewer_token, bob):
    assert api.get("/api/v1/security/denials/", reviewer_token).status_code == 403
    client.force_login(bob)
    assert api.get("/api/v1/security/denials/").status_code == 403
