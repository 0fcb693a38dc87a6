"""POST /events/'s hot path (api.events_fast): same answers as DRF, and the token cache
never outlives a revocation."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from api import events_fast
from api.models import Denial
from api.views import EventsView
from runs.actors import Actor
from runs.models import ApiToken, EventReceipt, Step
from runs.services import events as event_services
from runs.tokens import api_token_revoke
from tests.support.api import url, with_time_left_in_the_window
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db


def _batch(prefix: str = "e") -> dict:
    return {
        "epoch": 1,
        "events": [
            {"event_id": f"{prefix}1", "type": "step.started", "key": "plan", "name": "Plan ☃"},
            {"event_id": f"{prefix}2", "type": "step.completed", "key": "plan", "detail": {"n": 1}},
            {
                "event_id": f"{prefix}3",
                "type": "artifact.added",
                "name": "a.md",
                "step_key": "plan",
            },
            {"event_id": f"{prefix}4", "type": "checkpoint.saved", "label": "c1", "state": {}},
            {"event_id": f"{prefix}5", "type": "teleported"},
            {"event_id": f"{prefix}6", "type": "step.completed", "key": "ghost"},
        ],
    }


@pytest.fixture
def drf_refuses(monkeypatch):
    """Any request that reaches DRF's handler fails the test: the hot path must answer."""

    def refuse(*args, **kwargs):
        raise AssertionError("answered by DRF, not by the hot path")

    monkeypatch.setattr(EventsView, "post", refuse)


@pytest.fixture(autouse=True)
def empty_cache():
    events_fast.tokens.clear()
    yield
    events_fast.tokens.clear()


def test_the_hot_path_answers_a_plain_batch_and_writes_it(api, team, agent_token, drf_refuses):
    run, _ = make_running(team)
    response = api.post(url(run, "events/"), _batch(), agent_token)
    assert response.status_code == 200
    assert (response.json()["accepted"], response.json()["rejected"]) == (4, 2)
    step = Step.objects.get(run=run, key="plan")
    assert (step.status, step.detail, step.name) == ("completed", {"n": 1}, "Plan ☃")
    assert run.artifacts.get().step_id == step.pk
    assert EventReceipt.objects.filter(run=run).count() == 6
    run.refresh_from_db()
    assert run.resume_from == "c1"


def test_the_hot_path_answers_the_same_bytes_as_drf(api, team, agent_token):
    fast_run, _ = make_running(team)
    drf_run, _ = make_running(team)
    fast = api.post(url(fast_run, "events/"), _batch(), agent_token)
    # A query string is not a plain request: DRF answers it.
    slow = api.post(url(drf_run, "events/") + "?via=drf", _batch(), agent_token)
    assert len(events_fast.tokens) == 1  # only the first went the hot path
    assert fast.status_code == slow.status_code == 200
    assert fast.content == slow.content
    assert {name: fast[name] for name in fast.headers if name != "Content-Security-Policy"} == {
        name: slow[name] for name in slow.headers if name != "Content-Security-Policy"
    }


def test_a_revoked_token_is_refused_at_once(
    api, team, agent_token, django_capture_on_commit_callbacks
):
    run, _ = make_running(team)
    assert api.post(url(run, "events/"), _batch("a"), agent_token).status_code == 200
    assert len(events_fast.tokens) == 1
    with django_capture_on_commit_callbacks(execute=True):
        api_token_revoke(token_id=agent_token.token.pk, actor=Actor.system("test"))
    assert len(events_fast.tokens) == 0  # this process forgot it when the revocation committed
    response = api.post(url(run, "events/"), _batch("b"), agent_token)
    assert response.status_code == 401
    assert not EventReceipt.objects.filter(run=run, event_id__startswith="b").exists()


def test_a_token_revoked_by_another_process_writes_nothing(api, team, agent_token):
    """No notification reaches this process's cache: the locking query's re-check refuses."""
    run, _ = make_running(team)
    assert api.post(url(run, "events/"), _batch("a"), agent_token).status_code == 200
    ApiToken.objects.filter(pk=agent_token.token.pk).update(revoked_at=timezone.now())
    assert len(events_fast.tokens) == 1
    response = api.post(url(run, "events/"), _batch("b"), agent_token)
    assert response.status_code == 401
    assert response.json()["error"] == "authentication_failed"
    assert not EventReceipt.objects.filter(run=run, event_id__startswith="b").exists()
    assert len(events_fast.tokens) == 0


def test_the_service_refuses_a_token_check_that_no_longer_holds(team, agent_token):
    run, _ = make_running(team)
    token = agent_token.token
    check = event_services.TokenCheck(token_id=token.pk, team_id=token.team_id, role="reviewer")
    with pytest.raises(event_services.TokenNoLongerValid):
        event_services.events_ingest(
            run_id=run.pk,
            epoch=1,
            events=_batch()["events"],
            actor=Actor.for_token(token),
            token_check=check,
        )
    assert not EventReceipt.objects.filter(run=run).exists()
    assert not Step.objects.filter(run=run, key="plan", status="completed").exists()


def test_another_teams_token_is_still_a_counted_404(api, team, other_team, outsider_token):
    theirs, _ = make_running(other_team)
    ours, _ = make_running(team)
    # cached by a request of its own first
    assert api.post(url(theirs, "events/"), _batch("t"), outsider_token).status_code == 200
    before = Denial.objects.count()
    response = api.post(url(ours, "events/"), _batch("o"), outsider_token)
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert Denial.objects.count() == before + 1
    assert not EventReceipt.objects.filter(run=ours).exists()


def test_what_the_hot_path_does_not_take_drf_still_answers(api, team, agent_token):
    run, _ = make_running(team)
    events = url(run, "events/")
    with_seq = [
        *_batch()["events"],
        {"event_id": "s", "type": "checkpoint.saved", "label": "c2", "step_seq": 1},
    ]
    unusual = api.post(events, {"epoch": 1, "events": with_seq}, agent_token)
    assert unusual.status_code == 200 and unusual.json()["accepted"] == 5
    bad = api.post(events, {"epoch": 1, "events": [{"event_id": "x"}]}, agent_token)
    assert bad.status_code == 400 and bad.json()["field"] == "events[0].type"
    broken = api.post(events, raw=b'{"epoch": 1, "events": [', token=agent_token)
    assert broken.status_code == 400 and broken.json()["error"] == "parse_error"
    html = api.client.post(
        events,
        data=json.dumps(_batch("h")),
        content_type="application/json",
        HTTP_ACCEPT="text/html",
        **agent_token.header,
    )
    assert html.status_code == 406
    wrong = api.post(events, _batch("w"), None)
    assert wrong.status_code in (401, 403)


def test_the_rate_limit_still_holds_on_the_hot_path(api, team, agent_token, settings):
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 2
    with_time_left_in_the_window(5.0)
    settings.REDIS_URL = ""  # the database counter: nothing shared with other test sessions
    run, _ = make_running(team)
    answers = [
        api.post(url(run, "events/"), _batch(f"r{n}"), agent_token).status_code for n in range(3)
    ]
    assert answers == [200, 200, 429]


def test_last_used_is_still_recorded(api, team, agent_token):
    ApiToken.objects.filter(pk=agent_token.token.pk).update(last_used_at=None)
    run, _ = make_running(team)
    api.post(url(run, "events/"), _batch(), agent_token)
    assert ApiToken.objects.get(pk=agent_token.token.pk).last_used_at is not None
