"""Channels publisher for run changes (registered in `console.apps`).

Group names are the contract between publishers and consumers:
- `run_<id>`: viewers of one run (browser) — every change, with its sequence number;
- `team_<team_id>`: the runs page of a team — every change of any of its runs;
- `agent_<id>`: the worker of one run — the stop signal only.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer


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
    message = {**event, "type": "run.updated"}
    send = async_to_sync(layer.group_send)
    if event.get("kind") == "stop_signal":
        send(agent_group(event["run_id"]), {**event, "type": "stop.signal"})
    send(run_group(event["run_id"]), message)
    send(team_group(event["team"]), message)
