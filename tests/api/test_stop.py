"""POST /cancel/, /takeover/, /resume/, /close/, /drained/."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from runs.models import LedgerEntry, StopRequest
from tests.support.api import Api, lease_body, stop, url
from tests.support.scenarios import make_run, make_running, reload

pytestmark = pytest.mark.django_db


def test_stop_is_202_and_a_repeat_answers_the_same_stop_request(api, team, reviewer_token):
    run, _ = make_running(team)
    first = api.post(
        url(run, "cancel/"), {"reason": "user_stop", "note": "looks wrong"}, reviewer_token
    )
    again = api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token)
    assert first.status_code == again.status_code == 202
    body = first.json()
    assert (body["status"], body["stop_epoch"], body["created"]) == ("cancel_requested", 2, True)
    assert {key: body["stop_request"][key] for key in ("reason", "requested_by")} == {
        "reason": "user_stop",
        "requested_by": "reviewer-bot",
    }
    assert body["stop_request"]["requested_at"]
    assert again.json()["stop_request"]["id"] == body["stop_request"]["id"]
    assert again.json()["created"] is False
    assert StopRequest.objects.filter(run=run).count() == 1


def test_reason_defaults_to_user_stop(api, team, reviewer_token):
    run = make_run(team)
    assert (
        api.post(url(run, "cancel/"), {}, reviewer_token).json()["stop_request"]["reason"]
        == "user_stop"
    )


@pytest.mark.parametrize("reason", ["budget_exhausted", "timeout", "dependency_failure"])
def test_agent_tokens_may_stop_their_runs_for_their_own_reasons(api, team, agent_token, reason):
    run, _ = make_running(team)
    response = api.post(url(run, "cancel/"), {"reason": reason}, agent_token)
    assert response.status_code == 202
    assert response.json()["stop_request"]["reason"] == reason


@pytest.mark.parametrize("reason", ["user_stop", "manual_takeover", "admin_kill"])
def test_agent_tokens_may_not_stop_for_other_reasons(api, team, agent_token, reason):
    run, _ = make_running(team)
    response = api.post(url(run, "cancel/"), {"reason": reason}, agent_token)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert "budget_exhausted" in response.json()["detail"]
    assert reload(run).status == "running"


@pytest.mark.parametrize("reason", ["lease_expired", "drain_deadline", "because"])
def test_server_only_and_unknown_reasons_are_400(api, team, reviewer_token, reason):
    response = api.post(url(make_run(team), "cancel/"), {"reason": reason}, reviewer_token)
    assert response.status_code == 400
    assert response.json()["field"] == "reason"


def test_admin_kill_needs_an_admin(api, client, team, reviewer_token, alice):
    run = make_run(team)
    assert (
        api.post(url(run, "cancel/"), {"reason": "admin_kill"}, reviewer_token).status_code == 403
    )
    client.force_login(alice)
    response = api.post(url(run, "cancel/"), {"reason": "admin_kill"})
    assert response.status_code == 202
    assert response.json()["stop_request"]["requested_by"] == "alice"


def test_viewers_may_not_stop(api, client, team, charlie):
    run = make_run(team)
    client.force_login(charlie)
    response = api.post(url(run, "cancel/"), {"reason": "user_stop"})
    assert response.status_code == 403
    assert reload(run).status == "pending"


def test_session_stops_need_the_csrf_token(team, bob):
    run = make_run(team)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(bob)
    api = Api(browser)
    refused = api.post(url(run, "cancel/"), {"reason": "user_stop"})
    assert refused.status_code == 403
    assert "CSRF" in refused.json()["detail"]
    assert reload(run).status == "pending"
    secret = "s3cr3tCsrfValue0123456789abcdef"[:32].ljust(32, "x")
    browser.cookies["csrftoken"] = secret
    accepted = browser.post(
        url(run, "cancel/"),
        data={"reason": "user_stop"},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=secret,
    )
    assert accepted.status_code == 202
    assert accepted.json()["stop_request"]["requested_by"] == "bob"


def test_stopping_a_finished_run_is_409_already_finished(api, team, agent_token, reviewer_token):
    run, _ = make_running(team)
    api.post(
        url(run, "events/"),
        {"epoch": 1, "events": [{"event_id": "done", "type": "run.completed"}]},
        agent_token,
    )
    response = api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["status"], response.json()["stop_epoch"]) == (
        "already_finished",
        "completed",
        1,
    )


def test_another_teams_run_cannot_be_stopped(api, other_team, reviewer_token):
    run, _ = make_running(other_team)
    assert api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token).status_code == 404
    assert reload(run).status == "running"


def test_drained_settles_the_stop_and_a_retry_is_harmless(api, team, agent_token, reviewer_token):
    run, lease = make_running(team)
    api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token)
    first = api.post(url(run, "drained/"), lease_body(lease, observations=[]), agent_token)
    again = api.post(url(run, "drained/"), lease_body(lease), agent_token)
    assert first.status_code == again.status_code == 200
    assert first.json()["status"] == again.json()["status"] == "stopped_cleanly"


@pytest.mark.parametrize("write_in_flight", [False, True], ids=["clean", "dirty"])
def test_drained_answers_the_run_as_a_read_after_it_shows_it(
    api, team, agent_token, reviewer_token, write_in_flight
):
    run, lease = make_running(team)
    if write_in_flight:
        api.post(
            url(run, "permits/"),
            {"epoch": 1, "tool_call_id": "c1", "tool": "deploy", "side_effect": "write"},
            agent_token,
        )
    api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token)

    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        answer = api.post(url(run, "drained/"), lease_body(lease), agent_token).json()
    again = api.post(url(run, "drained/"), lease_body(lease), agent_token).json()
    read = api.get(url(run), agent_token).json()

    assert answer["status"] == ("stopped_dirty" if write_in_flight else "stopped_cleanly")
    assert answer == again == {key: read[key] for key in answer}
    # Nothing is read once the settle's transaction ended: the answer is the settled run.
    ended = max(
        index for index, sql in enumerate(statements) if sql.startswith("RELEASE SAVEPOINT")
    )
    assert statements[ended + 1 :] == []


def test_drained_with_observations_records_them(api, team, agent_token, reviewer_token):
    run, lease = make_running(team)
    api.post(
        url(run, "permits/"),
        {"epoch": 1, "tool_call_id": "c1", "tool": "deploy", "side_effect": "write"},
        agent_token,
    )
    api.post(url(run, "cancel/"), {"reason": "user_stop"}, reviewer_token)
    response = api.post(
        url(run, "drained/"),
        lease_body(
            lease,
            observations=[
                {"tool_call_id": "c1", "execution_state": "failed", "observation": "rolled back"}
            ],
        ),
        agent_token,
    )
    assert response.json()["status"] == "stopped_cleanly"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"observations": [{"tool_call_id": "c1", "execution_state": "exploded"}]},
            "observations[0].execution_state",
        ),
        (
            {
                "observations": [
                    {"tool_call_id": "c1", "execution_state": "failed", "operation_id": "o" * 201}
                ]
            },
            "observations[0].operation_id",
        ),
        ({"observations": {"not": "a list"}}, "observations"),
        ({"lease_id": None}, "lease_id"),
    ],
)
def test_drained_bad_input(api, team, agent_token, change, field):
    run, lease = make_running(team)
    stop(run)
    response = api.post(url(run, "drained/"), {**lease_body(lease), **change}, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_drained_at_a_wrong_epoch_is_409(api, team, agent_token):
    run, lease = make_running(team)
    stop(run)
    response = api.post(url(run, "drained/"), lease_body(lease, epoch=2), agent_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["status"]) == (
        "stale_epoch",
        "cancel_requested",
    )


def test_takeover_hands_a_quiet_run_to_a_human(api, team, reviewer_token):
    run = make_run(team)
    response = api.post(url(run, "takeover/"), {"note": "mine now"}, reviewer_token)
    assert response.status_code == 202
    assert response.json()["status"] == "handed_off"
    assert response.json()["stop_request"]["reason"] == "manual_takeover"
    again = api.post(url(run, "takeover/"), {}, reviewer_token)
    assert again.json()["stop_request"]["id"] == response.json()["stop_request"]["id"]


def test_takeover_needs_a_reviewer(api, client, team, agent_token, charlie):
    run = make_run(team)
    assert api.post(url(run, "takeover/"), {}, agent_token).status_code == 403
    client.force_login(charlie)
    assert api.post(url(run, "takeover/"), {}).status_code == 403
    assert reload(run).status == "pending"


def test_resume_starts_a_new_epoch_and_close_ends_the_run(api, team, reviewer_token):
    run = make_run(team)
    stop(run)
    resumed = api.post(
        url(run, "resume/"), {"note": "try again", "carry_over_steering": True}, reviewer_token
    )
    assert resumed.status_code == 200
    assert (resumed.json()["status"], resumed.json()["stop_epoch"]) == ("pending", 3)
    stop(run)
    closed = api.post(url(run, "close/"), {"note": "done with it"}, reviewer_token)
    assert closed.status_code == 200
    assert closed.json()["status"] == "cancelled"


def test_resume_and_close_of_a_running_run_are_409_illegal_transition(api, team, reviewer_token):
    run, _ = make_running(team)
    for action in ("resume/", "close/"):
        response = api.post(url(run, action), {}, reviewer_token)
        assert response.status_code == 409
        assert (
            response.json()["error"],
            response.json()["status"],
            response.json()["stop_epoch"],
        ) == ("illegal_transition", "running", 1)


def test_the_resume_note_reaches_the_ledger(api, team, reviewer_token):
    run = make_run(team)
    stop(run)
    response = api.post(url(run, "resume/"), {"note": "fixed the credentials"}, reviewer_token)
    assert response.status_code == 200
    entry = LedgerEntry.objects.filter(run=run, action="run.resume").get()
    assert entry.payload["note"] == "fixed the credentials"


def test_resume_from_an_unknown_checkpoint_is_400(api, team, reviewer_token):
    run = make_run(team)
    stop(run)
    response = api.post(url(run, "resume/"), {"checkpoint": "checkpoint_99"}, reviewer_token)
    assert response.status_code == 400
    assert response.json()["field"] == "checkpoint"


def test_reviewer_actions_on_another_teams_run_are_404(api, other_team, reviewer_token):
    run = make_run(other_team)
    stop(run)
    for action in ("takeover/", "resume/", "close/"):
        assert api.post(url(run, action), {}, reviewer_token).status_code == 404
    assert reload(run).status == "stopped_cleanly"
