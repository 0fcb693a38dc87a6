"""Browser frames on their own channel layer (console/settings.py, console/realtime.py).

With Redis, browsers listen on the "viewers" alias (channels-redis Pub/Sub: one PUBLISH per
change, at most once) and agent workers on "default" (the core layer: the stop signal must not
be lost). Over real sockets (`live_stack_redis`: daphne in another process, the same Redis):
- a burst of changes reaches a browser viewer in `seq` order with no gap, on the run socket and
  the runs-page socket, while the worker on the same run gets the stop signal and nothing else;
- a socket idle for longer than redis-py's 5 s default socket timeout still gets the next change
  (django/channels_redis#422 closes idle sockets on the core layer);
- the Pub/Sub layer resubscribes by itself when its Redis connection drops.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
import redis
from django.conf import settings
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from api.consumers import AgentRunConsumer
from console import realtime
from console.consumers import RunConsumer, TeamRunsConsumer
from runs import services
from tests.support.isolation import suite_redis_url
from tests.support.livestack import LiveStack
from tests.support.scenarios import AGENT, SYSTEM, new_run, start

REDIS_URL = suite_redis_url()


def _viewer(stack: LiveStack, path: str, user: Any) -> ClientConnection:
    client = Client()
    client.force_login(user)
    cookie = f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"
    return connect(
        f"{stack.ws_url}{path}",
        origin=f"http://127.0.0.1:{stack.port}",
        additional_headers={"Cookie": cookie},
        open_timeout=5,
    )


def _worker(stack: LiveStack, run_id: str, raw_token: str) -> ClientConnection:
    return connect(
        stack.agent_ws_url(run_id),
        additional_headers={"Authorization": f"Bearer {raw_token}"},
        open_timeout=5,
    )


def _frames_until(
    socket: ClientConnection, run_id: str, last_seq: int, timeout: float = 10
) -> list[dict]:
    """This run's frames until one says `last_seq` (or the timeout)."""
    frames: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frame = json.loads(socket.recv(timeout=max(0.05, deadline - time.monotonic())))
        except TimeoutError:
            break
        if frame.get("run_id") == run_id:
            frames.append(frame)
            if frame["seq"] >= last_seq:
                break
    return frames


def _ingest_one(run_id: str, epoch: int, key: str) -> None:
    services.events_ingest(
        run_id=run_id,
        epoch=epoch,
        actor=AGENT,
        events=[{"event_id": key, "type": "step.started", "key": key}],
    )


def _assert_in_order_without_gaps(frames: list[dict], first: int, last: int) -> None:
    seqs = [frame["seq"] for frame in frames]
    assert seqs == sorted(seqs), seqs
    # The stop sends two frames with its seq (the change and its signal): compare distinct values.
    assert sorted(set(seqs)) == list(range(first, last + 1)), seqs
    assert all(frame["type"] == "run.updated" for frame in frames)


@pytest.mark.slow  # two subprocesses
def test_the_aliases_the_consumers_and_the_publisher_agree_on():
    assert (
        RunConsumer.channel_layer_alias
        == TeamRunsConsumer.channel_layer_alias
        == realtime.VIEWER_LAYER
    )
    assert AgentRunConsumer.channel_layer_alias == "default" != realtime.VIEWER_LAYER
    assert set(settings.CHANNEL_LAYERS) >= {"default", realtime.VIEWER_LAYER}
    probe = (
        "import django; django.setup(); from django.conf import settings;"
        "print(' '.join(settings.CHANNEL_LAYERS[a]['BACKEND'] for a in ('default', 'viewers')))"
    )
    with_redis = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "REDIS_URL": REDIS_URL, "DJANGO_SETTINGS_MODULE": "console.settings"},
    )
    # The stop signal stays on the reliable core layer; only browsers move to Pub/Sub.
    assert with_redis.stdout.split() == [
        "channels_redis.core.RedisChannelLayer",
        "channels_redis.pubsub.RedisPubSubChannelLayer",
    ]
    embedded = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={
            **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
            "DJANGO_SETTINGS_MODULE": "console.settings",
        },
    )
    assert embedded.stdout.split() == ["channels.layers.InMemoryChannelLayer"] * 2


def test_a_burst_reaches_browser_viewers_in_order_and_the_stop_reaches_the_worker(
    live_stack_redis,
    team,
    charlie,
    agent_token,
):
    stack = live_stack_redis
    run = new_run(team)
    lease = start(run)
    run.refresh_from_db()
    first = run.change_seq + 1
    with (
        _viewer(stack, f"/ws/runs/{run.pk}/", charlie) as viewer,
        _viewer(stack, "/ws/runs/", charlie) as runs_page,
        _worker(stack, run.pk, agent_token.raw) as worker,
    ):
        time.sleep(0.3)  # subscriptions are made before accept(); give Redis a moment all the same
        for n in range(40):  # as fast as the test process commits: one frame per change
            _ingest_one(run.pk, lease.epoch, f"burst-{n}")
        services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM)
        run.refresh_from_db()
        last = run.change_seq

        signal = json.loads(worker.recv(timeout=10))
        assert (signal["type"], signal["stop_epoch"], signal["run_id"]) == (
            "cancel_requested",
            2,
            run.pk,
        )
        for socket in (viewer, runs_page):
            frames = _frames_until(socket, run.pk, last)
            _assert_in_order_without_gaps(frames, first, last)
            assert frames[-1]["status"] == "cancel_requested"
            # encoded once by the publisher (realtime.browser_frame): the whitelisted fields only
            assert {tuple(sorted(frame)) for frame in frames} == {
                tuple(sorted(realtime.BROWSER_FRAME_FIELDS))
            }
        # the worker's socket carries the stop signal only, never browser frames
        with pytest.raises(TimeoutError):
            worker.recv(timeout=0.5)


def test_sockets_idle_past_the_redis_default_socket_timeout_still_get_the_next_change(
    live_stack_redis,
    team,
    charlie,
    agent_token,
):
    stack = live_stack_redis
    run = new_run(team)
    start(run)
    with (
        _viewer(stack, f"/ws/runs/{run.pk}/", charlie) as viewer,
        _worker(stack, run.pk, agent_token.raw) as worker,
    ):
        time.sleep(7)  # redis-py 8's default socket timeout is 5 s
        services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM)
        run.refresh_from_db()
        try:
            signal = json.loads(worker.recv(timeout=10))
            frames = _frames_until(viewer, run.pk, run.change_seq)
        except ConnectionClosed as closed:
            # an idle socket closed with 1011 is django/channels_redis#422
            pytest.fail(f"an idle socket was closed: {closed}")
    assert signal["type"] == "cancel_requested"
    assert (
        frames
        and frames[-1]["seq"] == run.change_seq
        and frames[-1]["status"] == "cancel_requested"
    )


def test_the_pubsub_layer_resubscribes_after_its_redis_connection_drops():
    """At most once, but not at most until the next restart: after a dropped connection the
    layer's reader reconnects and resubscribes; frames published meanwhile may be lost."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    layer = RedisPubSubChannelLayer(
        hosts=[{"address": REDIS_URL, "socket_timeout": 15}],
        prefix=f"viewertest-{uuid.uuid4().hex[:12]}",
    )
    group = "run_" + uuid.uuid4().hex[:12]

    async def scenario() -> tuple[dict, int]:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        await layer.group_send(group, {"type": "run.updated", "seq": 1})
        assert (await asyncio.wait_for(layer.receive(channel), 5))["seq"] == 1

        # Drop exactly this layer's subscriber connection, from the server side.
        shard = layer._get_layer()._shards[0]
        host, port = shard._pubsub.connection._writer.get_extra_info("sockname")[:2]
        admin = redis.Redis.from_url(REDIS_URL)
        try:
            assert admin.client_kill_filter(_type="pubsub", addr=f"{host}:{port}") == 1
        finally:
            admin.close()

        receiving = asyncio.ensure_future(layer.receive(channel))
        seq, deadline = 2, time.monotonic() + 10
        while not receiving.done() and time.monotonic() < deadline:
            await layer.group_send(group, {"type": "run.updated", "seq": seq})
            seq += 1
            await asyncio.wait([receiving], timeout=0.2)
        assert receiving.done(), "the layer never resubscribed"
        frame = receiving.result()
        await layer.flush()
        return frame, seq

    frame, sent = asyncio.run(scenario())
    assert 2 <= frame["seq"] < sent


def test_the_publisher_encodes_a_browser_frame_once_and_consumers_forward_it_verbatim():
    """A frame is encoded once per change, not once per viewer (docs/BENCHMARKS.md)."""

    event = {
        "type": "run.updated",
        "kind": "stop_signal",
        "run_id": "run_abc",
        "team": 3,
        "status": "cancel_requested",
        "stop_epoch": 2,
        "seq": 9,
        "signal": {"requested_by": "alice"},
    }
    frame = json.loads(realtime.browser_frame(event))
    assert frame == {
        "type": "run.updated",
        "kind": "stop_signal",
        "run_id": "run_abc",
        "team": 3,
        "status": "cancel_requested",
        "stop_epoch": 2,
        "seq": 9,
    }  # no signal payload for browsers

    sent: list[str] = []

    async def base_send(message: dict[str, Any]) -> None:
        assert message["type"] == "websocket.send"
        sent.append(message["text"])

    probe = RunConsumer()
    probe.base_send = base_send
    probe.accepted = True
    asyncio.run(probe.run_updated({**event, "frame": "PRE-ENCODED"}))
    asyncio.run(probe.run_updated(event))  # an older publisher's message: encoded here
    assert sent == ["PRE-ENCODED", realtime.browser_frame(event)]


@pytest.mark.slow  # three subprocesses
def test_browser_frames_of_deployments_on_different_redis_databases_stay_apart():
    """Pub/Sub ignores the Redis database number: the prefix must carry it, or two deployments
    on one Redis server (the suite and the bench, say) would see each other's team_1 frames."""
    probe = (
        "import django; django.setup(); from django.conf import settings;"
        "print(settings.CHANNEL_LAYERS['viewers']['CONFIG']['prefix'])"
    )

    def prefix(**env: str) -> str:
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ("REDIS_URL", "SAFESTOP_VIEWER_CHANNEL_PREFIX")
        }
        return subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**base, "DJANGO_SETTINGS_MODULE": "console.settings", **env},
        ).stdout.strip()

    assert prefix(REDIS_URL="redis://127.0.0.1:6379/0") != prefix(
        REDIS_URL="redis://127.0.0.1:6379/9"
    )
    assert prefix(REDIS_URL="redis://127.0.0.1:6379") == prefix(
        REDIS_URL="redis://127.0.0.1:6379/0"
    )
    assert (
        prefix(REDIS_URL="redis://127.0.0.1:6379/0", SAFESTOP_VIEWER_CHANNEL_PREFIX="acme-prod")
        == "acme-prod"
    )

    async def crossing() -> list[dict]:
        from channels_redis.pubsub import RedisPubSubChannelLayer

        # Unique to this test, so another suite on this Redis server cannot cross it either.
        tag = uuid.uuid4().hex[:12]
        mine = RedisPubSubChannelLayer(hosts=[REDIS_URL], prefix=f"{tag}-safestop-db0")
        theirs = RedisPubSubChannelLayer(hosts=[REDIS_URL], prefix=f"{tag}-safestop-db9")
        channel = await mine.new_channel()
        await mine.group_add("team_1", channel)
        await asyncio.sleep(0.2)
        await theirs.group_send("team_1", {"type": "run.updated", "seq": 1})
        await mine.group_send("team_1", {"type": "run.updated", "seq": 2})
        got = [await asyncio.wait_for(mine.receive(channel), 3)]
        try:
            got.append(await asyncio.wait_for(mine.receive(channel), 0.5))
        except TimeoutError:
            pass
        await mine.flush()
        await theirs.flush()
        return got

    assert [frame["seq"] for frame in asyncio.run(crossing())] == [2]
