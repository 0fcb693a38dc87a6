"""Browser websockets are tied to the session they connected with (console/consumers.py).

The access re-check (the `access.changed` message and the timer) also asks whether the socket's
session would still log its user in, as django.contrib.auth.get_user judges it; if not, the
socket closes 4401:
- a logout (`user_logged_out`, console/apps.py) closes the socket of that session at once, and
  leaves a socket of the same user on another, still valid session open;
- a session deleted from the store is caught by the next re-check;
- a password change (the session auth hash no longer matches) closes the user's sockets;
- with the message lost, the timer still closes them.

In-process sockets (WebsocketCommunicator, the in-memory layer), as tests/console/test_live_access.py.
"""

from __future__ import annotations

import time
from importlib import import_module

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.test import Client

from console import realtime
from console.asgi import application
from tests.support.live_sockets import ORIGIN, close_code
from tests.support.scenarios import new_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_channel_layer"),
]


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


async def _open(path: str, client: Client) -> WebsocketCommunicator:
    """A socket on `client`'s session (the browser's cookie)."""
    cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
    communicator = WebsocketCommunicator(
        application,
        path,
        headers=[
            (b"origin", ORIGIN.encode()),
            (b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()),
        ],
    )
    connected, code = await communicator.connect()
    assert connected, code
    return communicator


async def _client(user) -> Client:
    return await database_sync_to_async(_logged_in)(user)


async def _new_run(team, **kwargs):
    return await database_sync_to_async(new_run)(team, **kwargs)


async def _access_changed(user) -> None:
    """The message as the publisher sends it, with nothing in it about any session."""
    await get_channel_layer(realtime.VIEWER_LAYER).group_send(
        realtime.user_group(user.pk), {"type": realtime.ACCESS_CHANGED, "user_id": user.pk}
    )


async def test_logging_out_closes_the_sockets_of_that_session(no_timer, team, bob):
    run = await _new_run(team)
    browser = await _client(bob)
    sockets = [await _open("/ws/runs/", browser), await _open(f"/ws/runs/{run.pk}/", browser)]

    await database_sync_to_async(browser.logout)()
    for socket in sockets:
        code, frames = await close_code(socket)
        assert code == 4401 and frames == []
        await socket.disconnect()


async def test_a_session_deleted_from_the_store_closes_its_sockets_at_the_next_recheck(
    no_timer, team, bob
):
    """An admin deleting sessions sends nothing; the re-check finds the session gone."""
    run = await _new_run(team)
    browser = await _client(bob)
    sockets = [await _open("/ws/runs/", browser), await _open(f"/ws/runs/{run.pk}/", browser)]
    key = browser.cookies[settings.SESSION_COOKIE_NAME].value

    store = import_module(settings.SESSION_ENGINE).SessionStore
    await database_sync_to_async(store(key).delete)()
    await _access_changed(bob)
    for socket in sockets:
        assert (await close_code(socket))[0] == 4401
        await socket.disconnect()


async def test_a_logout_message_closes_its_session_even_before_the_flush(no_timer, team, bob):
    """Django sends `user_logged_out` before it flushes the session, and a socket in another
    process may re-check first: the message's digest of the ended session closes it anyway.
    A digest of another session closes nothing."""
    laptop, phone = await _client(bob), await _client(bob)
    leaving, staying = await _open("/ws/runs/", laptop), await _open("/ws/runs/", phone)
    key = laptop.cookies[settings.SESSION_COOKIE_NAME].value
    layer = get_channel_layer(realtime.VIEWER_LAYER)
    await layer.group_send(
        realtime.user_group(bob.pk),
        {  # the session itself is still in the store
            "type": realtime.ACCESS_CHANGED,
            "user_id": bob.pk,
            "ended_session": realtime.session_digest(key),
        },
    )
    assert (await close_code(leaving))[0] == 4401
    mine = await _new_run(team)
    assert (await staying.receive_json_from(timeout=3))["run_id"] == mine.pk
    await leaving.disconnect()
    await staying.disconnect()


@pytest.mark.parametrize("update_fields", [["password"], None], ids=["update_fields", "full_save"])
async def test_a_password_change_closes_the_users_sockets(no_timer, team, bob, update_fields):
    run = await _new_run(team)
    browser = await _client(bob)
    sockets = [await _open("/ws/runs/", browser), await _open(f"/ws/runs/{run.pk}/", browser)]

    def change_password() -> None:
        user = get_user_model().objects.get(pk=bob.pk)
        user.set_password("a-new-password")
        user.save(update_fields=update_fields)

    await database_sync_to_async(change_password)()
    for socket in sockets:
        code, frames = await close_code(socket)
        assert code == 4401 and frames == []
        await socket.disconnect()


async def test_another_session_of_the_user_stays_open_when_one_logs_out(no_timer, team, bob):
    laptop, phone = await _client(bob), await _client(bob)
    leaving = await _open("/ws/runs/", laptop)
    staying = await _open("/ws/runs/", phone)

    await database_sync_to_async(laptop.logout)()
    assert (await close_code(leaving))[0] == 4401
    # The other session re-checked too (same user) and is still valid: frames keep coming.
    await _access_changed(bob)
    mine = await _new_run(team)
    assert (await staying.receive_json_from(timeout=3))["run_id"] == mine.pk
    assert await staying.receive_nothing(timeout=0.3)
    await leaving.disconnect()
    await staying.disconnect()


async def test_the_timer_closes_sockets_of_ended_sessions_when_the_message_is_lost(
    fast_timer, monkeypatch, team, bob, charlie
):
    # Every access.changed is lost (as a Pub/Sub message can be).
    monkeypatch.setattr(realtime, "membership_changed", lambda *args, **kwargs: None)
    run = await _new_run(team)
    bobs, charlies = await _client(bob), await _client(charlie)
    logged_out = await _open("/ws/runs/", bobs)
    new_password = await _open(f"/ws/runs/{run.pk}/", charlies)

    started = time.monotonic()
    await database_sync_to_async(bobs.logout)()
    # A queryset update sends no signal at all.
    await database_sync_to_async(get_user_model().objects.filter(pk=charlie.pk).update)(
        password=make_password("a-new-password")
    )
    for socket in (logged_out, new_password):
        code, _frames = await close_code(socket, timeout=5)
        assert code == 4401
        await socket.disconnect()
    assert time.monotonic() - started < 3 * fast_timer + 1


def test_logout_and_password_changes_are_announced(transactional_db, bob, monkeypatch):
    sent: list[tuple[int, str | None]] = []
    monkeypatch.setattr(
        realtime, "_send_access_changed", lambda user_id, ended=None: sent.append((user_id, ended))
    )
    browser = _logged_in(bob)
    key = browser.cookies[settings.SESSION_COOKIE_NAME].value
    assert sent == []
    Client().logout()  # nobody logged in: nothing to announce
    assert sent == []
    browser.logout()
    assert sent == [(bob.pk, realtime.session_digest(key))]
    sent.clear()
    bob.set_password("another")
    bob.save(update_fields=["password"])
    assert sent == [(bob.pk, None)]
