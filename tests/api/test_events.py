"""POST /events/: a batch, answered per event."""

from __future__ import annotations

import pytest

from runs.models import Checkpoint, Step
from tests.support.api import stop, url
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db


def test_each_event_is_answered_and_a_retry_is_a_duplicate(api, team, agent_token):
    run, _ = make_running(team)
    batch = {
        "epoch": 1,
        "events": [
            {"event_id": "e1", "type": "step.started", "key": "plan"},
            {"event_id": "e2", "type": "step.completed", "key": "plan"},
            {
                "event_id": "e3",
                "type": "checkpoint.saved",
                "label": "checkpoint_01",
                "state": {"n": 1},
                "step_seq": 1,
            },
            {"event_id": "e4", "type": "teleported"},
        ],
    }
    first = api.post(url(run, "events/"), batch, agent_token)
    assert first.status_code == 200
    assert [(a["event_id"], a["status"], a.get("code")) for a in first.json()["results"]] == [
        ("e1", "accepted", None),
        ("e2", "accepted", None),
        ("e3", "accepted", None),
        ("e4", "rejected", "unknown_event_type"),
    ]
    assert (first.json()["accepted"], first.json()["rejected"]) == (3, 1)
    again = api.post(url(run, "events/"), batch, agent_token)
    assert [a["status"] for a in again.json()["results"]] == ["duplicate"] * 4
    assert Step.objects.get(run=run, key="plan").status == "completed"
    assert Checkpoint.objects.filter(run=run).count() == 1


def test_a_step_started_at_a_stale_epoch_is_rejected_stale_epoch(api, team, agent_token):
    run, _ = make_running(team)
    stop(run)
    response = api.post(
        url(run, "events/"),
        {
            "epoch": 1,
            "events": [
                {"event_id": "late", "type": "step.started", "key": "act"},
                {"event_id": "fact", "type": "artifact.added", "name": "report.pdf"},
            ],
        },
        agent_token,
    )
    assert response.status_code == 200
    assert [(a["status"], a.get("code")) for a in response.json()["results"]] == [
        ("rejected", "stale_epoch"),
        ("accepted", None),
    ]


def test_an_event_with_an_out_of_range_field_is_rejected_alone(api, team, agent_token):
    run, _ = make_running(team)
    response = api.post(
        url(run, "events/"),
        {
            "epoch": 1,
            "events": [
                {"event_id": "a", "type": "checkpoint.saved", "label": "c", "step_seq": 10**12},
                {"event_id": "b", "type": "steering.applied", "steering_id": 10**30},
                {"event_id": "c", "type": "step.started", "key": "plan"},
            ],
        },
        agent_token,
    )
    answers = response.json()["results"]
    assert [(a["event_id"], a["status"], a.get("code")) for a in answers] == [
        ("a", "rejected", "invalid"),
        ("b", "rejected", "invalid"),
        ("c", "accepted", None),
    ]
    assert "step_seq" in answers[0]["detail"]


def test_batches_are_capped(api, team, agent_token):
    run, _ = make_running(team)
    events = [{"event_id": f"e{i}", "type": "artifact.added", "name": "x"} for i in range(501)]
    response = api.post(url(run, "events/"), {"epoch": 1, "events": events}, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == "events"


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([{"type": "step.started"}], "events[0].event_id"),
        (
            [
                {"event_id": "ok", "type": "artifact.added", "name": "x"},
                {"event_id": "", "type": "x"},
            ],
            "events[1].event_id",
        ),
        ([{"event_id": "x" * 121, "type": "x"}], "events[0].event_id"),
        ([{"event_id": "a", "type": {"nested": True}}], "events[0].type"),
        (["not an object"], "events[0]"),
        ("not a list", "events"),
    ],
)
def test_an_event_without_a_sound_identity_fails_the_batch(api, team, agent_token, events, field):
    run, _ = make_running(team)
    response = api.post(url(run, "events/"), {"epoch": 1, "events": events}, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_events_need_an_epoch(api, team, agent_token):
    run, _ = make_running(team)
    response = api.post(url(run, "events/"), {"events": []}, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == "epoch"


def test_events_wrong_role_and_other_team(api, client, team, other_team, charlie, agent_token):
    theirs, _ = make_running(other_team)
    body = {"epoch": 1, "events": [{"event_id": "e", "type": "artifact.added", "name": "x"}]}
    assert api.post(url(theirs, "events/"), body, agent_token).status_code == 404
    mine, _ = make_running(team)
    client.force_login(charlie)
    assert api.post(url(mine, "events/"), body).status_code == 403


def test_a_warm_run_team_cache_still_hides_the_run_from_another_team(
    api, team, other_team, agent_token
):
    """Agent writes check the run's team from a per-process cache (api.permissions.run_id_for):
    once the owner's agent has warmed it, another team's token still gets a 404, not the run."""
    from runs.tokens import api_token_create
    from tests.support.accounts import IssuedToken

    run, _ = make_running(team)
    owner = api.post(
        url(run, "events/"),
        {"epoch": 1, "events": [{"event_id": "w1", "type": "step.started", "key": "plan"}]},
        agent_token,
    )
    assert owner.status_code == 200
    token, raw = api_token_create(team_slug=other_team.slug, name="globex-agent", role="agent")
    stranger = api.post(
        url(run, "events/"),
        {"epoch": 1, "events": [{"event_id": "w2", "type": "step.completed", "key": "plan"}]},
        IssuedToken(token, raw),
    )
    assert stranger.status_code == 404
    assert Step.objects.get(run=run, key="plan").status == "running"


def test_an_unknown_run_is_404_and_is_not_remembered_as_missing(api, team, agent_token):
    from api.permissions import _run_team_id

    missing = api.post(url("run_000000000abc", "events/"), {"epoch": 1, "events": []}, agent_token)
    assert missing.status_code == 404
    run, _ = make_running(team)
    _run_team_id.cache_clear()
    assert (
        api.post(
            url(run, "events/"),
            {"epoch": 1, "events": [{"event_id": "x", "type": "artifact.added", "name": "a"}]},
            agent_token,
        ).status_code
        == 200
    )
    assert _run_team_id.cache_info().currsize >= 1


def test_one_event_per_request_moves_a_step_through_its_life(api, team, agent_token):
    """Single-event requests change one step each (a plain UPDATE, not bulk_update): every field
    an event sets must land."""
    run, _ = make_running(team)
    for event in (
        {
            "event_id": "s",
            "type": "step.started",
            "key": "call",
            "name": "Call the model",
            "kind": "model_call",
        },
        {"event_id": "c", "type": "step.completed", "key": "call", "detail": {"tokens": 900}},
    ):
        assert (
            api.post(url(run, "events/"), {"epoch": 1, "events": [event]}, agent_token).json()[
                "accepted"
            ]
            == 1
        )
    step = Step.objects.get(run=run, key="call")
    assert (step.status, step.name, step.kind, step.detail) == (
        "completed",
        "Call the model",
        "model_call",
        {"tokens": 900},
    )
    assert step.finished_at is not None and step.started_at is not None


def test_steps_started_one_request_at_a_time_are_numbered_in_order(api, team, agent_token):
    run, _ = make_running(team)
    planned = list(Step.objects.filter(run=run).order_by("seq").values_list("seq", "key"))
    assert not {"search", "fetch", "write"} & {key for _, key in planned} and planned[-1][0] == len(
        planned
    )
    for n, key in enumerate(
        ["search", "fetch", "search", "write"]
    ):  # "search" twice: no second step
        api.post(
            url(run, "events/"),
            {"epoch": 1, "events": [{"event_id": f"s{n}", "type": "step.started", "key": key}]},
            agent_token,
        )
    last = len(planned)
    assert list(Step.objects.filter(run=run).order_by("seq").values_list("seq", "key")) == [
        *planned,
        (last + 1, "search"),
        (last + 2, "fetch"),
        (last + 3, "write"),
    ]
