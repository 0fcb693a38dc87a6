"""The aggregates a policy reads, updated one fact at a time (DESIGN §14).

The same functions serve the live path (a `RunFacts` row, under the run lock) and the test
against history (`ReplayFacts`, in memory), so a replay counts exactly as enforcement would.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

from runs.models import ExecutionState, SideEffect

WINDOW_SECONDS = 60.0
# The side effects a run keeps timestamps of; past it `side_effects_last_minute` saturates.
MAX_SIDE_EFFECT_TIMES = 1000


class Facts(Protocol):
    tool_failures_in_a_row: int
    last_call_key: str
    repeats: int
    side_effect_times: list[float]


@dataclass
class ReplayFacts:
    tool_failures_in_a_row: int = 0
    last_call_key: str = ""
    repeats: int = 0
    side_effect_times: list[float] = field(default_factory=list)


def call_key(tool: str, arguments: Any) -> str:
    """The call's identity for `repeats`: its tool and canonical arguments (keys sorted, no
    whitespace), digested."""
    canonical = json.dumps(
        [tool, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def record_call(facts: Facts, *, tool: str, arguments: Any, side_effect: str, at: float) -> None:
    key = call_key(tool, arguments)
    facts.repeats = facts.repeats + 1 if key == facts.last_call_key else 1
    facts.last_call_key = key
    if side_effect == SideEffect.WRITE:
        record_side_effect(facts, at=at)


def record_side_effect(facts: Facts, *, at: float) -> None:
    recent = [t for t in facts.side_effect_times if t > at - WINDOW_SECONDS]
    recent.append(at)
    facts.side_effect_times = recent[-MAX_SIDE_EFFECT_TIMES:]


def record_result(facts: Facts, *, execution_state: str) -> None:
    if execution_state == ExecutionState.FAILED:
        facts.tool_failures_in_a_row += 1
    elif execution_state == ExecutionState.SUCCEEDED:
        facts.tool_failures_in_a_row = 0


def side_effects_last_minute(facts: Facts, *, at: float) -> int:
    return sum(1 for t in facts.side_effect_times if t > at - WINDOW_SECONDS)


def host_of(destination: str) -> str:
    """An outbox destination's host (a URL's, or an address's domain), lower case."""
    if "://" in destination:
        return (urlsplit(destination).hostname or "").lower()
    if "@" in destination:
        return destination.rsplit("@", 1)[1].lower()
    return destination.lower()


def call_host(arguments: Any) -> str:
    """The host a tool call reaches, when it says so in a `url` argument."""
    url = arguments.get("url") if isinstance(arguments, dict) else None
    return host_of(url) if isinstance(url, str) and "://" in url else ""
