"""A browser socket's handshake and close skip channels' per-message close_old_connections()
hop through the process's one sync thread (console/consumers.py): their database work goes
through database_sync_to_async, which closes stale connections itself. The access check still
runs at connect; `access.changed` still takes channels' ordinary path."""

from __future__ import annotations

import pytest
from channels import consumer as channels_consumer
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from console.asgi import application
from console.realtime import VIEWER_LAYER, user_group
from tests.support.live_sockets import ORIGIN
from tests.support.scenarios import new_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_channel_layer"),
]


@pytest.fixture
def hops(monkeypatch) -> list[str]:
    """Counts channels' close_old_connections() hops made by consumer dispatch."""
    made: list[str] = []

    async def counted() -> None:
        made.append("close_old_connections")

    monkeypatch.setattr(channels_consumer, "aclose_old_connections", counted)
    return made


def _cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


async def _open(path: str, user) -> tuple[WebsocketCommunicator, bool, int]:
    cookie = await database_sync_to_async(_cookie)(user)
    communicator = WebsocketCommunicator(
        application, path, headers=[(b"origin", ORIGIN.encode()), (b"cookie", cookie.encode())]
    )
    connected, code = await communicator.connect()
    return communicator, connected, code


async def test_handshake_and_close_make_no_extra_sync_thread_hop(team, charlie, hops):
    run = await database_sync_to_async(new_run)(team)
    for path in (f"/ws/runs/{run.pk}/", "/ws/runs/"):
        communicator, connected, _code = await _open(path, charlie)
        assert connected
        await communicator.disconnect()
    assert hops == []


async def test_the_access_check_still_runs_at_connect(team, other_team, outsider, hops):
    run = await database_sync_to_async(new_run)(team)
    communicator, connected, code = await _open(f"/ws/runs/{run.pk}/", outsider)
    assert not connected and code == 4403
    await communicator.disconnect()


async def test_an_access_change_still_takes_the_ordinary_path(team, charlie, hops):
    run = await database_sync_to_async(new_run)(team)
    communicator, connected, _code = await _open(f"/ws/runs/{run.pk}/", charlie)
    assert connected
    await get_channel_layer(VIEWER_LAYER).group_send(
        user_group(charlie.pk), {"type": "access.changed"}
    )
    await communicator.receive_nothing(timeout=0.5)
    assert hops == ["close_old_connections"]
    await communicator.disconnect()
