"""POST /outbox/."""

from __future__ import annotations

import pytest

from runs.models import OutboxItem
from tests.support.api import stop, url
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def allowed_hosts(settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]


def item(key="notify-1", **extra):
    return {
        "epoch": 1,
        "transport": "webhook",
        "destination": "https://hooks.example/in",
        "payload": {"text": "done"},
        "idempotency_key": key,
        **extra,
    }


def test_enqueue_is_201_and_a_retry_with_the_same_key_answers_the_first_item(
    api, team, agent_token
):
    run, _ = make_running(team)
    first = api.post(url(run, "outbox/"), item(), agent_token)
    again = api.post(url(run, "outbox/"), item(payload={"text": "changed"}), agent_token)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    assert {key: first.json()[key] for key in ("status", "idempotency_key")} == {
        "status": "pending",
        "idempotency_key": "notify-1",
    }
    assert first.json()["id"].startswith("outbox_")
    assert OutboxItem.objects.get().payload == {"text": "done"}


def test_enqueue_after_a_stop_is_409_stale_epoch(api, team, agent_token):
    run, _ = make_running(team)
    stop(run)
    response = api.post(url(run, "outbox/"), item(), agent_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["stop_epoch"]) == ("stale_epoch", 2)
    assert not OutboxItem.objects.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"destination": "https://evil.example/x"}, "destination"),
        ({"transport": "carrier_pigeon"}, "transport"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"transport": "email", "destination": "not-an-address"}, "destination"),
    ],
)
def test_enqueue_bad_input_names_the_field(api, team, agent_token, change, field):
    run, _ = make_running(team)
    response = api.post(url(run, "outbox/"), item(**change), agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_enqueue_on_another_teams_run_is_404(api, other_team, agent_token):
    run, _ = make_running(other_team)
    assert api.post(url(run, "outbox/"), item(), agent_token).status_code == 404
