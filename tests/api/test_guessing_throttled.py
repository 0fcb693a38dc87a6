"""Guessing is throttled (a token is the only credential an agent has): wrong bearer tokens per client address answer 429
with Retry-After, and are counted in /metrics; the stop path is never rate limited."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.api import url, with_time_left_in_the_window
from tests.support.scenarios import running

pytestmark = pytest.mark.django_db


@pytest.fixture
def as_staff_client(db) -> Client:
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_user(
        username="root", password="pw-root", is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(staff)
    return client


GUESSER = "203.0.113.7"
NEIGHBOUR = "203.0.113.8"


def _get(path: str, token: str, address: str):
    return Client(REMOTE_ADDR=address).get(path, HTTP_AUTHORIZATION=f"Bearer {token}")


def test_wrong_bearer_tokens_from_one_address_turn_into_429(settings, team, agent_token):
    settings.SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE = 5
    with_time_left_in_the_window(5.0)
    run, _lease = running(team)
    for guess in range(5):
        assert _get(url(run), f"ss_guess{guess}", GUESSER).status_code == 401
    throttled = _get(url(run), "ss_guess5", GUESSER)
    assert throttled.status_code == 429
    assert throttled.json()["error"] == "rate_limited"
    assert 0 < int(throttled["Retry-After"]) <= 60
    # the right token too, from that address: a 200 would tell the guesser it was right
    assert _get(url(run), agent_token.raw, GUESSER).status_code == 429
    # another address is not affected
    assert _get(url(run), agent_token.raw, NEIGHBOUR).status_code == 200


def test_wrong_bearer_tokens_on_metrics_are_throttled_too(settings, team):
    settings.SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE = 3
    with_time_left_in_the_window(5.0)
    for guess in range(3):
        assert _get("/metrics", f"ss_guess{guess}", GUESSER).status_code == 401
    blocked = _get("/metrics", "ss_guess3", GUESSER)
    assert blocked.status_code == 429 and int(blocked["Retry-After"]) > 0


def test_metrics_count_refused_tokens_and_throttling(settings, team, as_staff_client):
    settings.SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE = 2
    with_time_left_in_the_window(5.0)
    run, _lease = running(team)
    for guess in range(4):
        _get(url(run), f"ss_guess{guess}", GUESSER)
    text = as_staff_client.get("/metrics").content.decode()
    assert 'safestop_api_denials{reason="bad_token"} 2' in text
    assert 'safestop_api_denials{reason="throttled"} 2' in text


def test_the_stop_path_is_never_rate_limited(settings, team, agent_token, reviewer_token):
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 2
    run, lease = running(team)
    reviewer, agent = Client(), Client()
    for _ in range(2):
        assert reviewer.get(url(run), **reviewer_token.header).status_code == 200
    assert reviewer.get(url(run), **reviewer_token.header).status_code == 429
    stop = reviewer.post(
        url(run, "cancel/"), {"reason": "user_stop"}, "application/json", **reviewer_token.header
    )
    assert stop.status_code == 202
    for _ in range(3):
        assert agent.get(url(run), **agent_token.header).status_code in (200, 429)
    beat = agent.post(
        url(run, "lease/heartbeat/"),
        {"lease_id": lease.token, "epoch": lease.epoch},
        "application/json",
        **agent_token.header,
    )
    assert beat.status_code == 200 and beat.json()["signal"]["type"] == "cancel_requested"
    drained = agent.post(
        url(run, "drained/"),
        {"lease_id": lease.token, "epoch": lease.epoch},
        "application/json",
        **agent_token.header,
    )
    assert drained.status_code == 200
