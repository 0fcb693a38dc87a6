"""Channels publisher for run changes (registered in `console.apps`).

Group names are the contract between publishers and consumers:
- `run_<id>`: viewers of one run (browser) — every change, with its sequence number;
- `team_<team_id>`: the runs page of a team — every change of any of its runs;
- `agent_<id>`: the worker of one run — the stop signal only.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import get_channel_layer

# The event loop of the daphne process we run in (set by `manage.py serve`). The in-memory
# channel layer's queues belong to that loop, so a send from a thread that is not one of
# Django's sync_to_async workers (the embedded background loop) must run *on that loop*, or the
# waiting consumer is never woken. asgiref's own thread-local does exactly that routing.
_bound_loop: asyncio.AbstractEventLoop | None = None


def bind_event_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _bound_loop
    _bound_loop = loop


def _route_detached_thread_to_bound_loop() -> None:
    if _bound_loop is None or getattr(SyncToAsync.threadlocal, "main_event_loop", None) is not None:
        return
    try:
        asyncio.get_running_loop()
        return
    except RuntimeError:
        pass
    SyncToAsync.threadlocal.main_event_loop = _bound_loop
    SyncToAsync.threadlocal.main_event_loop_pid = os.getpid()


def run_group(run_id: str) -> str:
    return f"run_{run_id}"


def team_group(team_id: int | str) -> str:
    return f"team_{team_id}"


def agent_group(run_id: str) -> str:
    return f"agent_{run_id}"


def publish(event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    _route_detached_thread_to_bound_loop()
    message = {**event, "type": "run.updated"}
    send = async_to_sync(layer.group_send)
    if event.get("kind") == "stop_signal":
        send(agent_group(event["run_id"]), {**event, "type": "stop.signal"})
    send(run_group(event["run_id"]), message)
    send(team_group(event["team"]), message)
