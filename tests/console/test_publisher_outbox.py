"""A daphne request thread hands its run-change sends to the server's loop and returns
(console/realtime.py, `_LoopOutbox`): Django serves every sync view of a process in one thread,
which must not wait for Redis round trips. The sends still go out in commit order, a stop
signal before the browsers' frames of its change, and one failed send does not stop the rest.

Counted, not timed: how many sends had gone out when the thread returned, and their order."""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async

from console import realtime


class GatedLayer:
    """A Redis-like layer (not the in-memory one) whose sends wait for the test to open a gate."""

    def __init__(self, failing: str = "") -> None:
        self.gate = asyncio.Event()
        self.sent: list[tuple[str, int]] = []
        self.failing = failing

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
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
