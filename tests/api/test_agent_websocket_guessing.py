"""Guessing tokens on the agent websocket is throttled like over HTTP (or the socket would be the way around the limit): a wrong
token spends the address's budget, and a spent budget closes every handshake from the address
with 4429, the right token too, until the window ends; counted in /metrics."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from api import consumers, ratelimit
from console.asgi import application
from tests.support.api import with_time_left_in_the_window
from tests.support.livestack import start_live_stack
from tests.support.scenarios import make_running

LIMIT = 4
GUESSER, NEIGHBOUR = "127.0.0.1", "127.0.0.2"  # both loopback: the server sees two addresses


@pytest.fixture
def guarded_stack(transactional_db, django_db_blocker):
    overrides = {"SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE": LIMIT}
    with start_live_stack(django_db_blocker, settings_overrides=overrides) as stack:
        yield stack


@pytest.fixture
def as_staff_client(db) -> Client:
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.create_user(
        username="root", password="pw-root", is_staff=True, is_superuser=True
    )
    client = Client()
    client.force_login(staff)
    return client


def socket_close_code(url: str, token: str, *, source: str = GUESSER) -> int | None:
    """The code the server closed the handshake with, or None if the socket stayed open."""
    with connect(
        url,
        additional_headers={"Authorization": f"Bearer {token}"},
        open_timeout=5,
        source_address=(source, 0),
    ) as worker:
        try:
            worker.send(json.dumps({"type": "ping"}))
            frame = worker.recv(timeout=5)
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return closed.rcvd.code
    assert json.loads(frame) == {"type": "pong"}
    return None


def http_status(stack, run_id: str, token: str) -> httpx.Response:
    return httpx.get(
        f"{stack.url}/api/v1/runs/{run_id}/",
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )


def test_wrong_socket_tokens_spend_the_http_budget_then_4429_even_for_the_right_token(
    guarded_stack, team, agent_token, as_staff_client
):
    run, _lease = make_running(team)
    url = guarded_stack.agent_ws_url(run.pk)
    with_time_left_in_the_window()
    assert socket_close_code(url, agent_token.raw) is None  # before the budget is spent

    # Half the budget over HTTP, the rest on the socket: one budget per address.
    for guess in range(LIMIT // 2):
        assert http_status(guarded_stack, run.pk, f"ss_http{guess}").status_code == 401
    for guess in range(LIMIT - LIMIT // 2):
        assert socket_close_code(url, f"ss_ws{guess}") == 4401
    assert socket_close_code(url, "ss_one_too_many") == 4429
    assert socket_close_code(url, agent_token.raw) == 4429
    refused = http_status(guarded_stack, run.pk, agent_token.raw)
    assert refused.status_code == 429 and 0 < int(refused.headers["Retry-After"]) <= 60

    # Another address keeps its own budget.
    assert socket_close_code(url, agent_token.raw, source=NEIGHBOUR) is None

    text = as_staff_client.get("/metrics").content.decode()
    assert f'safestop_api_denials{{reason="bad_token"}} {LIMIT}' in text
    assert 'safestop_api_denials{reason="throttled"} 3' in text  # two sockets, one request


async def socket_close_code_in_process(path: str, token: str) -> int | None:
    communicator = WebsocketCommunicator(
        application, path, headers=[(b"authorization", f"Bearer {token}".encode())]
    )
    connected, _ = await communicator.connect(timeout=3)
    assert connected
    await communicator.send_json_to({"type": "ping"})
    message = await communicator.receive_output(timeout=3)
    if message["type"] == "websocket.close":
        await communicator.wait()
        return message["code"]
    assert json.loads(message["text"]) == {"type": "pong"}
    await communicator.disconnect()
    return None


@pytest.mark.django_db(transaction=True)
async def test_a_blocked_address_is_refused_before_any_token_lookup_until_the_window_ends(
    settings, monkeypatch, caplog, team, agent_token
):
    settings.SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE = 2
    caplog.set_level(logging.INFO, logger="safestop.refusals")
    clock = [1_800_000_000.0]  # the start of a window
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(time=lambda: clock[0]))
    run, _lease = await database_sync_to_async(make_running)(team)
    path = f"/ws/agent/runs/{run.pk}/"
    for guess in range(2):
        assert await socket_close_code_in_process(path, f"ss_guess{guess}") == 4401
    assert await socket_close_code_in_process(path, "ss_guess2") == 4429

    lookups: list[str] = []
    real_lookup = consumers.api_token_authenticate
    monkeypatch.setattr(
        consumers, "api_token_authenticate", lambda raw: lookups.append(raw) or real_lookup(raw)
    )
    clock[0] += 59
    assert await socket_close_code_in_process(path, agent_token.raw) == 4429
    assert lookups == []  # refused before the token was even looked up

    clock[0] += 2  # the next window: the block and the count are over
    assert await socket_close_code_in_process(path, agent_token.raw) is None
    assert lookups == [agent_token.raw]
    refused = [r for r in caplog.records if r.name == "safestop.refusals" and "4429" in r.message]
    assert len(refused) == 2 and all(r.levelno == logging.WARNING for r in refused)
