"""A daphne request thread hands its run-change sends to the server's loop and returns
(console/realtime.py, `_LoopOutbox`): Django serves every sync view of a process in one thread,
which must not wait for Redis round trips. The sends still go out in commit order, a stop
signal before the browsers' frames of its change, and one failed send does not stop the rest.
A worker's frame (a stop signal) is the one send the thread waits for, so it is not left
waiting for a loop whose thread is busy answering; the browsers' frames after it are not waited
for.

Counted, not timed: how many sends had gone out when the thread returned, and their order."""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async

from console import realtime


class GatedLayer:
    """A Redis-like layer (not the in-memory one) whose sends wait for the test to open a gate."""

    def __init__(self, failing: str = "", ungated: tuple[str, ...] = ()) -> None:
        self.gate = asyncio.Event()
        self.sent: list[tuple[str, int]] = []
        self.failing = failing
        self.ungated = ungated

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        if group not in self.ungated:
            await self.gate.wait()
        if group == self.failing and message["seq"] == 2:
            raise ConnectionError("Redis went away")
        self.sent.append((group, message["seq"]))


async def _until(predicate: Any) -> None:
    for _ in range(300):
        if predicate():
            return
        await asyncio.sleep(0.01)


async def test_a_request_thread_does_not_wait_for_its_sends_and_their_order_is_kept():
    layer = GatedLayer()

    def request_thread() -> int:
        for seq in range(1, 6):
            realtime._send([(layer, "agent_r", {"seq": seq}), (layer, "run_r", {"seq": seq})])
        return len(layer.sent)

    # Returned with every send still queued (a thread that waited would never return: the
    # gate opens only after it; wait_for turns that into a failure).
    assert await asyncio.wait_for(sync_to_async(request_thread)(), 10) == 0
    layer.gate.set()
    await _until(lambda: len(layer.sent) == 10)
    assert layer.sent == [(group, seq) for seq in range(1, 6) for group in ("agent_r", "run_r")]


async def test_a_failed_send_is_logged_and_the_next_ones_still_go(caplog):
    layer = GatedLayer(failing="run_r")

    def request_thread() -> None:
        for seq in (1, 2, 3):
            realtime._send([(layer, "agent_r", {"seq": seq}), (layer, "run_r", {"seq": seq})])

    await sync_to_async(request_thread)()
    layer.gate.set()
    await _until(lambda: len(layer.sent) == 5)
    assert layer.sent == [
        ("agent_r", 1),
        ("run_r", 1),
        ("agent_r", 2),
        ("agent_r", 3),
        ("run_r", 3),
    ]
    assert "publishing to run_r failed" in caplog.text


async def test_without_a_request_thread_the_in_memory_layer_is_still_sent_to_at_once():
    """The embedded process (in-memory layers) keeps waiting for its sends, on its loop."""
    from channels.layers import InMemoryChannelLayer

    layer = InMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("run_m", channel)

    def request_thread() -> None:
        realtime._send([(layer, "run_m", {"type": "run.updated", "seq": 1})])

    await sync_to_async(request_thread)()
    assert (await asyncio.wait_for(layer.receive(channel), 3))["seq"] == 1


async def test_a_request_thread_waits_for_a_workers_frame_and_not_for_the_browsers():
    layer = GatedLayer(ungated=("agent_r",))

    def request_thread() -> list[tuple[str, int]]:
        realtime._send([(layer, "agent_r", {"seq": 1}), (layer, "run_r", {"seq": 1})], wait_for=1)
        return list(layer.sent)

    # The worker's frame had gone when the thread returned; the browsers' was still queued (a
    # thread that waited for it would never return: the gate opens only after).
    assert await asyncio.wait_for(sync_to_async(request_thread)(), 10) == [("agent_r", 1)]
    layer.gate.set()
    await _until(lambda: len(layer.sent) == 2)
    assert layer.sent == [("agent_r", 1), ("run_r", 1)]


async def test_a_workers_frame_still_goes_after_the_frames_committed_before_it():
    layer = GatedLayer(ungated=("agent_r",))

    def request_thread() -> list[tuple[str, int]]:
        realtime._send([(layer, "run_r", {"seq": 1})])
        realtime._send([(layer, "agent_r", {"seq": 2}), (layer, "run_r", {"seq": 2})], wait_for=1)
        return list(layer.sent)

    waiting = asyncio.ensure_future(sync_to_async(request_thread)())
    layer.gate.set()
    # Whenever the gate opened, the thread returned once its worker's frame had gone, and that
    # was after the browsers' frame of the change committed before it.
    assert (await asyncio.wait_for(waiting, 10))[:2] == [("run_r", 1), ("agent_r", 2)]
    await _until(lambda: len(layer.sent) == 3)
    assert layer.sent == [("run_r", 1), ("agent_r", 2), ("run_r", 2)]


async def test_publish_waits_for_a_stop_signal_only(monkeypatch):
    layer = GatedLayer(ungated=("agent_r",))
    monkeypatch.setattr(
        realtime, "agent_sends", lambda event: [(layer, "agent_r", event)] if event["seq"] else []
    )
    monkeypatch.setattr(realtime, "viewer_sends", lambda event: [(layer, "run_r", event)])

    def request_thread() -> list[tuple[str, int]]:
        realtime.publish({"kind": "run.updated", "seq": 0})  # a change no worker hears of
        realtime.publish({"kind": "stop_signal", "seq": 1})
        return list(layer.sent)

    waiting = asyncio.ensure_future(sync_to_async(request_thread)())
    layer.gate.set()
    assert (await asyncio.wait_for(waiting, 10))[:2] == [("run_r", 0), ("agent_r", 1)]
    await _until(lambda: len(layer.sent) == 3)
    assert layer.sent[2] == ("run_r", 1)
