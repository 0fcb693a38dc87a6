"""One feed per group and process (console/consumers_fanout.py): the channel layer holds one
member per group however many sockets of the process watch it, a change is received and turned
into one `websocket.send` message for all of them, and a socket only filters and writes it.

Counted, never timed: members of the layer's groups, messages built, the identity of what each
socket was handed, and the frames each socket got."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from console import consumers_fanout, realtime
from console.asgi import application
from console.consumers_fanout import GroupFeed, feed_join, feed_leave, feed_sizes
from console.wire import Frame
from tests.support.live_sockets import ORIGIN
from tests.support.scenarios import new_run

pytestmark = pytest.mark.usefixtures("fresh_channel_layer")


def _event(run_id: str, team: int, seq: int) -> dict[str, Any]:
    event = {
        "type": "run.updated",
        "kind": "run.step_started",
        "run_id": run_id,
        "team": team,
        "status": "running",
        "stop_epoch": 1,
        "seq": seq,
    }
    return {**event, "frame": realtime.browser_frame(event)}


class Member:
    def __init__(self, sees: bool = True) -> None:
        self.sees = sees
        self.handed: list[dict[str, Any]] = []
        self.access: list[dict[str, Any]] = []

    def offer(self, event: dict[str, Any], frame: Frame) -> bool:
        return False  # no wire: through `forward`, as a socket outside daphne

    async def forward(self, event: dict[str, Any], frame: Frame) -> None:
        if self.sees:
            self.handed.append(frame.outgoing)

    def access_message(self, event: dict[str, Any]) -> None:
        self.access.append(event)


async def test_a_process_joins_a_group_once_and_builds_one_message_per_change():
    layer = get_channel_layer(realtime.VIEWER_LAYER)
    members = [Member() for _ in range(50)]
    for member in members:
        await feed_join(layer, "run_x", member)
    assert len(layer.groups["run_x"]) == 1  # one member of the layer's group, not 50
    assert feed_sizes() == {"run_x": 50}

    for seq in (1, 2, 3):
        await layer.group_send("run_x", _event("run_x", 1, seq))
    for _ in range(50):
        if all(len(member.handed) == 3 for member in members):
            break
        await asyncio.sleep(0.01)
    assert [len(member.handed) for member in members] == [3] * 50
    # The same message object for every socket: nothing encoded or built per socket.
    for position in range(3):
        assert len({id(member.handed[position]) for member in members}) == 1
    assert [m["text"] for m in members[0].handed] == [
        _event("run_x", 1, seq)["frame"] for seq in (1, 2, 3)
    ]

    for member in members:
        await feed_leave(layer, "run_x", member)
    assert feed_sizes() == {}
    assert not layer.groups.get("run_x")  # the last socket gone, the process leaves the group


async def test_a_broken_socket_does_not_starve_the_others():
    class Broken(Member):
        async def forward(self, event: dict[str, Any], frame: Frame) -> None:
            raise ConnectionError("reset")

    layer = get_channel_layer(realtime.VIEWER_LAYER)
    first, broken, last = Member(), Broken(), Member()
    for member in (first, broken, last):
        await feed_join(layer, "team_1", member)
    feed = consumers_fanout._of_this_loop()[(layer, "team_1")]
    await feed.deliver(_event("run_y", 1, 1))
    assert len(first.handed) == 1 and len(last.handed) == 1
    for member in (first, broken, last):
        await feed_leave(layer, "team_1", member)


async def test_an_access_change_reaches_every_socket_of_the_user_before_any_later_frame():
    layer = get_channel_layer(realtime.VIEWER_LAYER)
    member = Member()
    await feed_join(layer, "user_7", member)
    feed: GroupFeed = consumers_fanout._of_this_loop()[(layer, "user_7")]
    await feed.deliver({"type": realtime.ACCESS_CHANGED, "user_id": 7})
    assert member.access == [{"type": realtime.ACCESS_CHANGED, "user_id": 7}]
    assert member.handed == []
    await feed_leave(layer, "user_7", member)


def _cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.mark.django_db(transaction=True)
async def test_many_sockets_of_one_run_share_one_feed_and_each_gets_every_frame(
    no_timer, team, bob
):
    run = await database_sync_to_async(new_run)(team)
    cookie = await database_sync_to_async(_cookie)(bob)
    sockets = []
    for _ in range(10):
        communicator = WebsocketCommunicator(
            application,
            f"/ws/runs/{run.pk}/",
            headers=[(b"origin", ORIGIN.encode()), (b"cookie", cookie.encode())],
        )
        connected, _code = await communicator.connect()
        assert connected
        sockets.append(communicator)
    layer = get_channel_layer(realtime.VIEWER_LAYER)
    group = realtime.run_group(run.pk)
    assert len(layer.groups[group]) == 1
    assert feed_sizes()[group] == 10
    for seq in range(1, 6):
        await layer.group_send(group, _event(run.pk, team.pk, seq))
    for communicator in sockets:
        assert [(await communicator.receive_json_from(timeout=3))["seq"] for _ in range(5)] == [
            1,
            2,
            3,
            4,
            5,
        ]
    for communicator in sockets:
        await communicator.disconnect()
    assert group not in feed_sizes()
