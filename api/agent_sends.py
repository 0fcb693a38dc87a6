"""What a change sends to agent workers: the frames `api/consumers.py` receives.

The run-change publisher (`console.realtime.publish`, the one listener of `runs.notify`) asks
here which agent groups an event reaches and with what, and sends them in the same hop to the
event loop as the browser frames — the worker's first, so a stop reaches the worker before any
browser hears of it. The agent's frames stay on the "default" (core) layer, which queues per
channel: a lost stop signal would leave a worker running until its next heartbeat.

- `stop_signal`: the stop signal to `agent_<run>` (the consumer's `stop_signal`); viewers get
  their usual frame too;
- `approval_decided`: the decision to `agent_<run>` only (viewers hear of it from the run's own
  change);
- `token_revoked`: to `token_<token>`, every socket opened with the token, which closes (4401).
"""

from __future__ import annotations

from typing import Any

from channels.layers import get_channel_layer

from runs.groups import agent_group, token_group

Send = tuple[Any, str, dict[str, Any]]

# Changes only a worker hears of: no browser frame is sent for them.
AGENT_ONLY_KINDS = frozenset({"token_revoked", "approval_decided"})


def agent_sends(event: dict[str, Any]) -> list[Send]:
    """The (layer, group, message) sends of `event` to agent sockets; none for most changes."""
    kind = event.get("kind")
    if kind not in AGENT_ONLY_KINDS and kind != "stop_signal":
        return []
    workers = get_channel_layer()
    if workers is None:
        return []
    if kind == "token_revoked":
        return [(workers, token_group(event["token_id"]), event)]
    if kind == "approval_decided":
        return [(workers, agent_group(event["run_id"]), event)]
    return [(workers, agent_group(event["run_id"]), {**event, "type": "stop.signal"})]


def for_agents_only(event: dict[str, Any]) -> bool:
    return event.get("kind") in AGENT_ONLY_KINDS
