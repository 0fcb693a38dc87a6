"""Browser websockets follow access changes while they are open (console/consumers.py).

A socket authorises at connect and then listens on its user's `user_<id>` group: a membership
saved or deleted, or a change of is_active / is_staff / is_superuser, sends `access.changed`
there (console/realtime.py, wired in console/apps.py) and the socket re-reads the user's access:
- a user removed from a team stops receiving its frames; a run socket of that team is closed
  4403, and so is the runs-page socket once no team is left;
- a user added to a team receives its frames without reconnecting;
- the message is at most once (Redis Pub/Sub), so a timer re-checks too: a lost message delays
  a revocation by at most SAFESTOP_WS_ACCESS_RECHECK_SECONDS;
- a `run.updated` frame still costs no database hop (the fan-out fast path).

In-process sockets (WebsocketCommunicator, the in-memory layer, as tests/console/test_consumers.py),
and one test over real sockets and Redis Pub/Sub across processes (`live_stack_redis`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from asgiref.sync import SyncToAsync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from console import realtime
from console.asgi import application
from runs.models import Membership, Role
from tests.support.live_sockets import ORIGIN, close_code
from tests.support.scenarios import new_run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fresh_channel_layer"),
]


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


async def _open(path: str, user) -> WebsocketCommunicator:
    cookie = await database_sync_to_async(_session_cookie)(user)
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


async def _new_run(team, **kwargs):
    return await database_sync_to_async(new_run)(team, **kwargs)


async def _join(user, team, role=Role.VIEWER) -> Membership:
    return await database_sync_to_async(Membership.objects.create)(user=user, team=team, role=role)


async def _remove(user, team) -> None:
    await database_sync_to_async(lambda: Membership.objects.get(user=user, team=team).delete())()


async def test_a_user_removed_from_a_team_stops_receiving_it_and_its_run_socket_closes(
    no_timer, team, other_team, bob
):
    await _join(bob, other_team)
    theirs = await _new_run(other_team, title="other team's")
    runs_page = await _open("/ws/runs/", bob)
    run_page = await _open(f"/ws/runs/{theirs.pk}/", bob)

    before = await _new_run(other_team, title="still a member")
    assert (await runs_page.receive_json_from(timeout=3))["run_id"] == before.pk

    await _remove(bob, other_team)
    code, frames = await close_code(run_page)
    assert code == 4403 and frames == []

    # Still a member of `team`: the runs page stays open, with `team`'s frames only.
    leaked = await _new_run(other_team, title="no longer bob's")
    mine = await _new_run(team, title="bob's")
    frame = await runs_page.receive_json_from(timeout=3)
    assert frame["run_id"] == mine.pk, f"{leaked.pk} leaked"
    assert await runs_page.receive_nothing(timeout=0.3)

    # The last team gone: nothing left to watch.
    await _remove(bob, team)
    code, frames = await close_code(runs_page)
    assert code == 4403 and frames == []
    await run_page.disconnect()
    await runs_page.disconnect()


async def test_a_user_added_to_a_team_receives_its_frames_without_reconnecting(
    no_timer, team, other_team, charlie
):
    runs_page = await _open("/ws/runs/", charlie)
    await database_sync_to_async(new_run)(other_team, title="before charlie joined")
    assert await runs_page.receive_nothing(timeout=0.3)

    await _join(charlie, other_team)
    # The join happens when the socket has handled the message: publish until a frame arrives.
    created: set[str] = set()
    frame = None
    deadline = time.monotonic() + 5
    while frame is None and time.monotonic() < deadline:
        created.add((await _new_run(other_team, title="after charlie joined")).pk)
        if not await runs_page.receive_nothing(timeout=0.2):
            frame = await runs_page.receive_json_from(timeout=1)
    assert frame is not None and frame["run_id"] in created and frame["team"] == other_team.pk
    # and the first team still arrives too
    mine = await _new_run(team)
    while (frame := await runs_page.receive_json_from(timeout=3))["run_id"] != mine.pk:
        assert frame["run_id"] in created
    await runs_page.disconnect()


async def test_deactivating_a_user_closes_every_socket_at_once(no_timer, team, bob):
    run = await _new_run(team)
    sockets = [await _open("/ws/runs/", bob), await _open(f"/ws/runs/{run.pk}/", bob)]

    def deactivate() -> None:
        bob.is_active = False
        bob.save()

    await database_sync_to_async(deactivate)()
    for socket in sockets:
        assert (await close_code(socket))[0] == 4403
        await socket.disconnect()


async def test_staff_losing_staff_keeps_only_their_own_teams(no_timer, team, other_team, bob):
    def promote() -> None:
        bob.is_staff = True
        bob.save()

    await database_sync_to_async(promote)()
    runs_page = await _open("/ws/runs/", bob)
    theirs = await _new_run(other_team)
    assert (await runs_page.receive_json_from(timeout=3))["run_id"] == theirs.pk

    def demote() -> None:
        bob.is_staff = False
        bob.save(update_fields=["is_staff"])

    await database_sync_to_async(demote)()
    leaked = await _new_run(other_team)
    mine = await _new_run(team)
    assert (await runs_page.receive_json_from(timeout=3))["run_id"] == mine.pk, (
        f"{leaked.pk} leaked"
    )
    await runs_page.disconnect()


def test_only_access_changes_of_a_user_are_announced(
    transactional_db, team, other_team, bob, monkeypatch
):
    sent: list[int] = []
    monkeypatch.setattr(realtime, "_send_access_changed", sent.append)
    Client().force_login(bob)  # a login saves last_login only: no access change
    get_user_model().objects.create_user(username="newcomer", password="x")  # no sockets yet
    assert sent == []
    membership = Membership.objects.create(user=bob, team=other_team, role=Role.VIEWER)
    membership.role = Role.REVIEWER
    membership.save()
    membership.delete()
    bob.is_superuser = True
    bob.save(update_fields=["is_superuser"])
    assert sent == [bob.pk] * 4


async def test_the_timer_closes_sockets_when_the_message_is_lost(
    fast_timer, monkeypatch, team, other_team, bob, charlie
):
    # Every access.changed is lost (as a Pub/Sub message can be).
    monkeypatch.setattr(realtime, "membership_changed", lambda user_id: None)
    run = await _new_run(team)
    runs_page = await _open("/ws/runs/", bob)
    run_page = await _open(f"/ws/runs/{run.pk}/", charlie)

    started = time.monotonic()
    await _remove(bob, team)
    # A queryset update sends no signal at all.
    await database_sync_to_async(get_user_model().objects.filter(pk=charlie.pk).update)(
        is_active=False
    )
    for socket in (runs_page, run_page):
        code, _frames = await close_code(socket, timeout=5)
        assert code == 4403
        await socket.disconnect()
    assert time.monotonic() - started < 3 * fast_timer + 1


async def test_the_timer_also_picks_up_a_lost_join(
    fast_timer, monkeypatch, team, other_team, charlie
):
    monkeypatch.setattr(realtime, "membership_changed", lambda user_id: None)
    runs_page = await _open("/ws/runs/", charlie)
    await _join(charlie, other_team)
    created: set[str] = set()
    deadline, frame = time.monotonic() + 5, None
    while frame is None and time.monotonic() < deadline:
        created.add((await _new_run(other_team)).pk)
        if not await runs_page.receive_nothing(timeout=0.3):
            frame = await runs_page.receive_json_from(timeout=1)
    assert frame is not None and frame["run_id"] in created
    await runs_page.disconnect()


async def test_run_frames_take_no_database_hop(no_timer, team, bob, monkeypatch):
    """The fan-out fast path: `run.updated` never goes through a sync thread (no ORM, no
    close_old_connections); only `access.changed` and the timer do."""
    run = await _new_run(team)
    sockets = [await _open(f"/ws/runs/{run.pk}/", bob), await _open("/ws/runs/", bob)]
    hops: list[Any] = []
    original = SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        hops.append(self.func)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counting)
    layer = get_channel_layer(realtime.VIEWER_LAYER)
    for seq in range(1, 31):
        event = {
            "type": "run.updated",
            "kind": "run.step_started",
            "run_id": run.pk,
            "team": team.pk,
            "status": "running",
            "stop_epoch": 1,
            "seq": seq,
        }
        message = {**event, "frame": realtime.browser_frame(event)}
        await layer.group_send(realtime.run_group(run.pk), message)
        await layer.group_send(realtime.team_group(team.pk), message)
    for socket in sockets:
        assert [(await socket.receive_json_from(timeout=3))["seq"] for _ in range(30)] == list(
            range(1, 31)
        )
    assert hops == []
    # The counter works: an access message does hop (close_old_connections, the access read).
    hops.clear()
    await layer.group_send(
        realtime.user_group(bob.pk), {"type": realtime.ACCESS_CHANGED, "user_id": bob.pk}
    )
    assert await sockets[0].receive_nothing(timeout=0.3)
    assert hops
    for socket in sockets:
        await socket.disconnect()


def test_removal_over_redis_pubsub_reaches_another_process(live_stack_redis, team, other_team, bob):
    """Real sockets to daphne in another process; the test process commits the change and
    publishes `access.changed` through Redis Pub/Sub, as a Celery worker or another web process would."""
    stack = live_stack_redis
    Membership.objects.create(user=bob, team=other_team, role=Role.VIEWER)
    theirs = new_run(other_team)
    client = Client()
    client.force_login(bob)
    headers = {
        "Cookie": f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    }
    origin = f"http://127.0.0.1:{stack.port}"
    with (
        connect(
            f"{stack.ws_url}/ws/runs/", origin=origin, additional_headers=headers, open_timeout=5
        ) as runs_page,
        connect(
            f"{stack.ws_url}/ws/runs/{theirs.pk}/",
            origin=origin,
            additional_headers=headers,
            open_timeout=5,
        ) as run_page,
    ):
        time.sleep(
            0.3
        )  # the subscriptions are made before accept(); give Redis a moment all the same
        Membership.objects.filter(user=bob, team=other_team).delete()
        with pytest.raises(ConnectionClosed) as closed:
            run_page.recv(timeout=5)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
        leaked = new_run(other_team)
        mine = new_run(team)
        frame = json.loads(runs_page.recv(timeout=5))
        assert frame["run_id"] == mine.pk, f"{leaked.pk} leaked"
