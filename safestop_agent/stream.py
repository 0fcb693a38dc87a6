"""Collect tool calls from a streamed model answer, and never act on half of one.

Seed §6: "the model stream returned only half of a tool call's arguments → do
not execute the incomplete call, do not fabricate a completed result."

Tool-call arguments arrive as string fragments (OpenAI-style deltas
`{"index": 0, "id": "call_1", "function": {"name": "search", "arguments": "{\\"q\\":"}}`).
Only when the stream ends normally are calls assembled and their arguments
parsed; a cancel, a broken stream or a `length` cut-off discards everything
received so far into `discarded`, kept for the record and never executed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .cancel import CancelToken

# finish_reason values that mean the model's answer was cut off mid-way.
TRUNCATED_FINISH_REASONS = frozenset({"length", "content_filter"})


@dataclass(frozen=True)
class CompleteToolCall:
    """A call whose stream ended normally and whose arguments parsed as a JSON object."""

    index: int
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class DiscardedToolCall:
    """What arrived of a call that must not run, and why."""

    index: int
    id: str | None
    name: str | None
    arguments_text: str
    why: str


@dataclass
class StreamOutcome:
    calls: list[CompleteToolCall] = field(default_factory=list)
    discarded: list[DiscardedToolCall] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    interrupted_by: str | None = None


@dataclass
class _PartialCall:
    index: int
    id: str | None = None
    name: str | None = None
    argument_parts: list[str] = field(default_factory=list)

    @property
    def arguments_text(self) -> str:
        return "".join(self.argument_parts)

    def discard(self, why: str) -> DiscardedToolCall:
        return DiscardedToolCall(self.index, self.id, self.name, self.arguments_text, why)


class ToolCallAccumulator:
    """Feed deltas with `add()`, then call `finish()` (normal end) or `abandon(why)`."""

    def __init__(self) -> None:
        self._partials: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None

    def add(self, chunk: Any) -> None:
        """Accept a full chunk (`{"choices": [...]}`), a delta (`{"tool_calls": [...]}`) or one tool-call delta."""
        for delta in _tool_call_deltas(chunk, self):
            self._add_delta(delta)

    def _add_delta(self, delta: Mapping[str, Any]) -> None:
        index = int(delta.get("index", 0))
        partial = self._partials.setdefault(index, _PartialCall(index))
        if delta.get("id"):
            partial.id = str(delta["id"])
        function = delta.get("function") or {}
        if function.get("name"):
            partial.name = (partial.name or "") + str(function["name"])
        if function.get("arguments"):
            partial.argument_parts.append(str(function["arguments"]))

    def finish(self) -> StreamOutcome:
        """The stream ended normally: return the calls that are whole, discard the rest."""
        if self.finish_reason in TRUNCATED_FINISH_REASONS:
            return self.abandon(f"finish_reason={self.finish_reason}")
        outcome = StreamOutcome(finished=True, finish_reason=self.finish_reason)
        for partial in self._ordered():
            complete, problem = _assemble(partial)
            if complete is not None:
                outcome.calls.append(complete)
            else:
                outcome.discarded.append(partial.discard(problem))
        return outcome

    def abandon(self, why: str) -> StreamOutcome:
        """The answer did not end normally: nothing in it may run."""
        return StreamOutcome(
            discarded=[partial.discard(why) for partial in self._ordered()],
            finished=False,
            finish_reason=self.finish_reason,
            interrupted_by=why,
        )

    def _ordered(self) -> list[_PartialCall]:
        return [self._partials[index] for index in sorted(self._partials)]


def collect_tool_calls(chunks: Iterable[Any], *, token: CancelToken | None = None) -> StreamOutcome:
    """Consume a model stream and return its complete tool calls, or none at all.

    The token is checked before each chunk; when it is set, or the stream
    raises, reading stops and every call received so far is discarded. The
    stream's error is not re-raised: `outcome.interrupted_by` says what happened.
    """
    accumulator = ToolCallAccumulator()
    iterator = iter(chunks)
    try:
        for chunk in _until_cancelled(iterator, token):
            accumulator.add(chunk)
    except Exception as error:  # a broken stream is an outcome to record, not a crash
        return accumulator.abandon(f"stream_error: {type(error).__name__}: {error}")
    finally:
        close = getattr(iterator, "close", None)
        if callable(close):
            close()  # stop the producer (e.g. an HTTP response) promptly
    if token is not None and token.cancelled:
        return accumulator.abandon(f"cancelled: {token.reason}")
    return accumulator.finish()


def _until_cancelled(iterator: Iterator[Any], token: CancelToken | None) -> Iterator[Any]:
    for chunk in iterator:
        if token is not None and token.cancelled:
            return
        yield chunk


def _assemble(partial: _PartialCall) -> tuple[CompleteToolCall | None, str]:
    if not partial.id or not partial.name:
        return None, "missing id or function name"
    text = partial.arguments_text.strip() or "{}"
    try:
        arguments = json.loads(text)
    except ValueError as error:
        return None, f"arguments are not complete JSON: {error}"
    if not isinstance(arguments, dict):
        return None, "arguments are not a JSON object"
    return CompleteToolCall(partial.index, partial.id, partial.name, arguments), ""


def _tool_call_deltas(chunk: Any, accumulator: ToolCallAccumulator) -> list[Mapping[str, Any]]:
    """Normalise the chunk shapes providers send into a list of tool-call deltas."""
    if hasattr(chunk, "model_dump"):  # SDK objects (pydantic) → plain dicts
        chunk = chunk.model_dump()
    if not isinstance(chunk, Mapping):
        return []
    if "choices" in chunk:
        deltas: list[Mapping[str, Any]] = []
        for choice in chunk.get("choices") or []:
            if choice.get("finish_reason"):
                accumulator.finish_reason = str(choice["finish_reason"])
            deltas.extend((choice.get("delta") or {}).get("tool_calls") or [])
        return deltas
    if "tool_calls" in chunk:
        return list(chunk.get("tool_calls") or [])
    if "index" in chunk or "function" in chunk:
        return [chunk]
    return []
