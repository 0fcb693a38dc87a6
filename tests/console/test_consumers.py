"""Browser websockets: the session is required, the Origin is checked, each run is authorised
against the user's teams, and a change committed after connecting arrives as a frame."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from console.asgi import application
from runs import services
from runs.actors import Actor
from tests.support.live_sockets import ORIGIN
from tests.support.scenarios import AGENT, new_run, start

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_channel_layer"),
]


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def _connect(
    path: str, *, user=None, origin: str | None = ORIGIN
) -> tuple[WebsocketCommunicator, bool, int]:
    headers = []
    if origin:
        headers.append((b"origin", origin.encode()))
    if user is not None:
        cookie = await database_sync_to_async(_session_cookie)(user)
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={cookie}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect()
    return communicator, connected, code


async def test_no_session_is_refused(team):
    run = await database_sync_to_async(new_run)(team)
    for path in (f"/ws/runs/{run.pk}/", "/ws/runs/"):
        communicator, connected, code = await _connect(path)
        assert not connected and code == 4401
        await communicator.disconnect()


async def test_foreign_origin_is_refused(team, bob):
    run = await database_sync_to_async(new_run)(team)
    for origin in ("https://evil.example", None):
        communicator, connected, _code = await _connect(
            f"/ws/runs/{run.pk}/", user=bob, origin=origin
        )
        assert not connected, origin
        await communicator.disconnect()


async def test_another_teams_run_is_refused(team, other_team, outsider):
    run = await database_sync_to_async(new_run)(team)
    communicator, connected, code = await _connect(f"/ws/runs/{run.pk}/", user=outsider)
    assert not connected and code == 4403
    missing, connected, code = await _connect("/ws/runs/run_doesnotexist/", user=outsider)
    assert not connected and code == 4403
    await communicator.disconnect()
    await missing.disconnect()


async def test_a_change_after_connect_arrives(team, charlie, bob):
    run = await database_sync_to_async(new_run)(team)
    lease = await database_sync_to_async(start)(run)
    communicator, connected, _code = await _connect(
        f"/ws/runs/{run.pk}/", user=charlie
    )  # a viewer may watch
    assert connected
    assert await communicator.receive_nothing(timeout=0.1)
    await database_sync_to_async(services.run_stop)(
        run_id=run.pk, reason="user_stop", actor=Actor.for_user(bob)
    )
    # The worker's signal is published first (runs/services/lifecycle.stop_locked), then the
    # viewers' change of the same commit: both carry the same seq, so a page applies it once.
    signal = await communicator.receive_json_from(timeout=3)
    assert signal["kind"] == "stop_signal" and signal["status"] == "cancel_requested"
    frame = await communicator.receive_json_from(timeout=3)
    assert frame["type"] == "run.updated" and frame["run_id"] == run.pk
    assert frame["status"] == "cancel_requested" and frame["stop_epoch"] == 2
    assert frame["kind"] == "run.stop_requested" and frame["team"] == team.pk
    assert frame["seq"] == signal["seq"]
    await database_sync_to_async(services.lease_heartbeat)(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT
    )
    frames = [await communicator.receive_json_from(timeout=3)]
    while (
        frames[-1]["status"] != "draining" and len(frames) < 5
    ):  # the stop also announces its signal
        frames.append(await communicator.receive_json_from(timeout=3))
    assert frames[-1]["status"] == "draining" and frames[-1]["seq"] > frame["seq"]
    await communicator.disconnect()


async def test_runs_page_socket_sees_its_teams_only(team, other_team, bob):
    communicator, connected, _code = await _connect("/ws/runs/", user=bob)
    assert connected
    await database_sync_to_async(new_run)(other_team, title="not for bob")
    assert await communicator.receive_nothing(timeout=0.3)
    mine = await database_sync_to_async(new_run)(team, title="for bob")
    frame = await communicator.receive_json_from(timeout=3)
    assert (
        frame["run_id"] == mine.pk
        and frame["kind"] == "run.created"
        and frame["status"] == "pending"
    )
    await communicator.disconnect()


async def test_a_user_with_no_team_is_refused_the_runs_socket(db, django_user_model):
    lonely = await database_sync_to_async(django_user_model.objects.create_user)(
        username="lonely", password="x"
    )
    communicator, connected, code = await _connect("/ws/runs/", user=lonely)
    assert not connected and code == 4403
    await communicator.disconnect()


async def test_browsers_cannot_send(team, bob):
    run = await database_sync_to_async(new_run)(team)
    communicator, connected, _code = await _connect(f"/ws/runs/{run.pk}/", user=bob)
    assert connected
    await communicator.send_json_to({"type": "run.updated", "status": "completed"})
    assert await communicator.receive_nothing(timeout=0.2)
    run_status = await database_sync_to_async(lambda: type(run).objects.get(pk=run.pk).status)()
    assert run_status == "pending"
    await communicator.disconnect()
