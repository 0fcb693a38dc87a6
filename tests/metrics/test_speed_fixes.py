"""Behaviour the performance decisions must keep (docs/ARCHITECTURE.md, Performance decisions;
figures in docs/BENCHMARKS.md).

These tests check what the code does, not how fast (the figures come from bench/):
- the stop freezes its run's pending outbox items (and nothing else) in one statement;
- a run change published from a process with no event loop (Celery, a command) still reaches
  every group — through one long-lived loop instead of a new thread, loop and Redis
  connection per frame; from a request thread it still runs on the server's loop.
"""

from __future__ import annotations

import os
import threading
import uuid

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from console import realtime
from runs import services
from runs.groups import agent_group
from runs.models import LedgerEntry, OutboxItem, OutboxStatus, StopReason
from tests.support.scenarios import SYSTEM, make_running

pytestmark = pytest.mark.django_db

REDIS_URL = (
    os.environ.get("SAFESTOP_TEST_REDIS_URL")
    or os.environ.get("REDIS_URL")
    or "redis://127.0.0.1:6379/0"
)


def _enqueue(run, lease, key: str) -> OutboxItem:
    item, _created = services.outbox_enqueue(
        run_id=run.pk,
        epoch=lease.epoch,
        transport="webhook",
        destination="https://hooks.example.test/x",
        payload={"key": key},
        idempotency_key=key,
        actor=SYSTEM,
    )
    return item


def test_stop_freezes_exactly_the_runs_pending_items_and_ledgers_their_count(team, settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.test"]
    run, lease = make_running(team)
    pending = [_enqueue(run, lease, f"p{n}") for n in range(3)]
    in_flight = _enqueue(run, lease, "claimed")
    assert services.outbox_claim(item_id=in_flight.pk, dispatcher="d1") is not None
    other, other_lease = make_running(team)
    untouched = _enqueue(other, other_lease, "other")

    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=SYSTEM)
    services.outbox_relabel_frozen(run_id=run.pk)  # the rows as readers saw them from the stop

    for item in pending:
        item.refresh_from_db()
        assert (item.status, item.frozen_by_epoch) == (OutboxStatus.FROZEN, lease.epoch + 1)
        assert item.frozen_at is not None
    in_flight.refresh_from_db()
    untouched.refresh_from_db()
    assert in_flight.status == OutboxStatus.DISPATCHING and in_flight.frozen_at is None
    assert untouched.status == OutboxStatus.PENDING
    entry = LedgerEntry.objects.get(run=run, action="run.stop_requested")
    assert entry.payload["frozen_outbox"] == 3


@pytest.fixture
def redis_layer(settings):
    prefix = "ssbench" + uuid.uuid4().hex[:8]
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": prefix},
        },
        realtime.VIEWER_LAYER: {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": prefix},
        },
    }
    yield get_channel_layer(), get_channel_layer(realtime.VIEWER_LAYER)


def test_publish_without_an_event_loop_reaches_every_group_through_one_loop(redis_layer):
    """The stop signal on the workers' (core) layer, browser frames on the viewers' (Pub/Sub) one."""
    import asyncio

    workers, viewers = redis_layer
    run_id = "run_" + uuid.uuid4().hex[:12]
    groups = {
        "agent": (workers, agent_group(run_id)),
        "run": (viewers, realtime.run_group(run_id)),
        "team": (viewers, realtime.team_group(7)),
    }
    event = {
        "type": "stop.signal",
        "kind": "stop_signal",
        "run_id": run_id,
        "team": 7,
        "status": "cancel_requested",
        "stop_epoch": 2,
        "seq": 5,
        "signal": {"type": "cancel_requested", "stop_epoch": 2},
    }
    loops = set()

    def publish_three_times() -> None:  # a plain thread with no running loop: the Celery situation
        for _ in range(3):
            realtime.publish(event)
            loops.add(id(realtime._publisher_loop()))

    async def listen_while_publishing() -> dict:
        # Pub/Sub subscriptions live on the loop that made them: subscribe, publish and receive
        # all while this one loop runs.
        channels = {}
        for name, (layer, group) in groups.items():
            channels[name] = await layer.new_channel()
            await layer.group_add(group, channels[name])
        await asyncio.get_running_loop().run_in_executor(None, publish_three_times)
        return {
            name: [await asyncio.wait_for(groups[name][0].receive(channel), 5) for _ in range(3)]
            for name, channel in channels.items()
        }

    received = async_to_sync(listen_while_publishing)()
    publishers = [thread for thread in threading.enumerate() if thread.name == "safestop-publisher"]
    assert [frame["type"] for frame in received["agent"]] == ["stop.signal"] * 3
    assert [frame["type"] for frame in received["run"]] == ["run.updated"] * 3
    assert [frame["type"] for frame in received["team"]] == ["run.updated"] * 3
    assert all(
        frame["seq"] == 5 and frame["run_id"] == run_id
        for frames in received.values()
        for frame in frames
    )
    assert received["agent"][0]["signal"]["stop_epoch"] == 2
    assert len(loops) == 1 and len(publishers) == 1


def test_publish_from_a_request_thread_still_runs_on_the_servers_loop(redis_layer, monkeypatch):
    """A thread inside SyncToAsync (a daphne request) routes to the server's loop as before;
    the private publisher loop is not used for it."""
    from asgiref.sync import sync_to_async

    def no_private_loop() -> None:
        raise AssertionError("a request thread must publish on the server's loop")

    monkeypatch.setattr(realtime, "_publisher_loop", no_private_loop)
    _workers, layer = redis_layer
    run_id = "run_" + uuid.uuid4().hex[:12]

    async def server() -> dict:
        channel = await layer.new_channel()
        await layer.group_add(realtime.run_group(run_id), channel)
        await sync_to_async(realtime.publish)(
            {
                "kind": "events",
                "run_id": run_id,
                "team": 1,
                "status": "running",
                "stop_epoch": 1,
                "seq": 9,
            }
        )
        return await layer.receive(channel)

    frame = async_to_sync(server)()
    assert frame["type"] == "run.updated" and frame["seq"] == 9


# --------------------------------------------------------------------------------------------
# events: one read of the batch's steps instead of three queries per step


def _ingest(run, lease, events):
    return {
        answer.event_id: (answer.status, answer.code)
        for answer in services.events_ingest(
            run_id=run.pk, epoch=lease.epoch, events=events, actor=SYSTEM
        )
    }


def test_a_batch_numbers_starts_completes_and_links_steps_as_before(team):
    from runs.models import Artifact, Step

    run, lease = make_running(team)  # planned: plan (1), act (2), notify (3)
    answers = _ingest(
        run,
        lease,
        [
            {
                "event_id": "e1",
                "type": "step.started",
                "key": "act",
                "name": "Act now",
                "kind": "tool_read",
            },
            {"event_id": "e2", "type": "step.started", "key": "fetch"},
            {"event_id": "e3", "type": "step.completed", "key": "fetch", "detail": {"rows": 3}},
            {"event_id": "e4", "type": "step.started", "key": "bad", "name": {"not": "a string"}},
            {"event_id": "e5", "type": "step.started", "key": "write", "kind": "tool_write"},
            {"event_id": "e6", "type": "artifact.added", "name": "rows.csv", "step_key": "fetch"},
            {"event_id": "e7", "type": "artifact.added", "name": "plan.md", "step_key": "plan"},
            {"event_id": "e8", "type": "artifact.added", "name": "loose.txt", "step_key": "ghost"},
            {"event_id": "e9", "type": "step.completed", "key": "ghost"},
            {"event_id": "e10", "type": "step.completed", "key": "bad"},
        ],
    )
    assert answers["e4"] == ("rejected", "invalid")
    assert answers["e9"] == ("rejected", "unknown_step") and answers["e10"] == (
        "rejected",
        "unknown_step",
    )
    assert all(answers[e] == ("accepted", "") for e in ("e1", "e2", "e3", "e5", "e6", "e7", "e8"))
    steps = {step.key: step for step in Step.objects.filter(run=run)}
    assert {key: step.seq for key, step in steps.items()} == {
        "plan": 1,
        "act": 2,
        "notify": 3,
        "fetch": 4,
        "write": 5,
    }
    assert (steps["act"].status, steps["act"].name, steps["act"].kind) == (
        "running",
        "Act now",
        "tool_read",
    )
    assert (steps["fetch"].status, steps["fetch"].detail) == ("completed", {"rows": 3})
    assert steps["fetch"].finished_at is not None and steps["fetch"].name == "fetch"
    assert steps["write"].status == "running"
    links = dict(Artifact.objects.filter(run=run).values_list("name", "step_id"))
    assert links == {"rows.csv": steps["fetch"].pk, "plan.md": steps["plan"].pk, "loose.txt": None}

    # the next batch sees what the last one wrote
    answers = _ingest(
        run,
        lease,
        [
            {"event_id": "f1", "type": "step.completed", "key": "write"},
            {"event_id": "f2", "type": "step.started", "key": "next"},
            {"event_id": "f3", "type": "step.started", "key": "fetch"},  # a restart keeps its seq
        ],
    )
    assert set(answers.values()) == {("accepted", "")}
    steps = {step.key: step for step in Step.objects.filter(run=run)}
    assert (steps["write"].status, steps["next"].seq, steps["fetch"].seq) == ("completed", 6, 4)
    assert steps["fetch"].status == "running" and steps["fetch"].finished_at is None


def test_a_batch_of_step_pairs_writes_its_steps_once(team):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run, lease = make_running(team)
    events = []
    for n in range(45):
        events.append({"event_id": f"s{n}", "type": "step.started", "key": f"k{n}"})
        events.append({"event_id": f"c{n}", "type": "step.completed", "key": f"k{n}"})
    with CaptureQueriesContext(connection) as queries:
        answers = _ingest(run, lease, events)
    assert set(answers.values()) == {("accepted", "")}
    sql = [q["sql"] for q in queries.captured_queries]
    # one SELECT: the batch's named steps and the run's last step (its seq numbers the new ones)
    assert len([q for q in sql if q.startswith("SELECT") and '"runs_step"' in q]) == 1
    assert (
        len([q for q in sql if q.startswith('INSERT INTO "runs_step"')]) == 1
    )  # 45 steps, inserted completed
    assert not [q for q in sql if q.startswith('UPDATE "runs_step"')]
    assert len(sql) <= 15  # the batch's own statements, whatever its size
    from runs.models import Step

    assert set(
        Step.objects.filter(run=run, key__startswith="k").values_list("status", flat=True)
    ) == {"completed"}
    assert list(
        Step.objects.filter(run=run, key__startswith="k")
        .order_by("seq")
        .values_list("seq", flat=True)
    ) == list(range(4, 49))  # after the three planned steps, in event order


# --------------------------------------------------------------------------------------------
# the Redis channel layer: a socket read must outlast the layer's blocking pop


@pytest.mark.slow  # a subprocess
def test_the_redis_channel_layer_reads_longer_than_its_blocking_pop():
    """With redis-py 8's 5 s default socket timeout, an idle consumer's 5 s BZPOPMIN would time
    out and close the socket with 1011, so the layer's socket timeout must outlast the pop."""
    import subprocess
    import sys

    probe = (
        "import django; django.setup();"
        "from channels.layers import get_channel_layer;"
        "layer = get_channel_layer();"
        "blocking = getattr(layer, 'brpop_timeout', None);"  # the Pub/Sub layer has no blocking pop
        "connection = layer.create_pool(0).make_connection() if blocking else None;"
        "print(connection.socket_timeout if connection else None, blocking or 0)"
    )
    env = {**os.environ, "REDIS_URL": REDIS_URL, "DJANGO_SETTINGS_MODULE": "console.settings"}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    socket_timeout, brpop_timeout = out.stdout.split()
    assert socket_timeout == "None" or float(socket_timeout) > float(brpop_timeout)


# --------------------------------------------------------------------------------------------
# the web process freezes its startup objects out of the garbage collector


def test_the_asgi_application_freezes_what_it_imported_out_of_the_collector():
    """Full collections walking every import made the fan-out's p99 100–160 ms on this machine
    (p50 20 ms); with the startup heap frozen it is ~30 ms (docs/BENCHMARKS.md, fan-out)."""
    import subprocess
    import sys

    probe = (
        "import gc, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'console.settings'); "
        "before = gc.get_freeze_count(); import console.asgi; print(before, gc.get_freeze_count())"
    )
    before, after = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split()
    assert int(before) == 0 and int(after) > 10_000
