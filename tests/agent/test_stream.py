from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from safestop_agent import CancelToken, collect_tool_calls


def chunk(
    index: int,
    *,
    id: str | None = None,
    name: str | None = None,
    args: str | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    delta: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        delta["id"] = id
    return {"choices": [{"delta": {"tool_calls": [delta]}, "finish_reason": finish_reason}]}


def finish(reason: str = "tool_calls") -> dict[str, Any]:
    return {"choices": [{"delta": {}, "finish_reason": reason}]}


def two_interleaved_calls() -> list[dict[str, Any]]:
    return [
        chunk(0, id="call_a", name="search", args='{"q": "ref'),
        chunk(1, id="call_b", name="deploy", args='{"service"'),
        chunk(0, args='und"}'),
        chunk(1, args=': "api", "version": 7}'),
        finish(),
    ]


def test_complete_calls_are_assembled_across_interleaved_chunks() -> None:
    outcome = collect_tool_calls(two_interleaved_calls())
    assert outcome.finished
    assert outcome.discarded == []
    assert [(c.id, c.name, c.arguments) for c in outcome.calls] == [
        ("call_a", "search", {"q": "refund"}),
        ("call_b", "deploy", {"service": "api", "version": 7}),
    ]


def test_a_stream_that_breaks_mid_call_yields_nothing_to_execute() -> None:
    executed: list[str] = []

    def broken_stream() -> Iterator[dict[str, Any]]:
        yield chunk(0, id="call_a", name="search", args='{"q": "refund"}')
        yield chunk(1, id="call_b", name="deploy", args='{"service": "ap')
        raise ConnectionResetError("peer went away")

    outcome = collect_tool_calls(broken_stream())
    for call in outcome.calls:
        executed.append(call.name)

    assert executed == [], "nothing from an interrupted answer may run"
    assert not outcome.finished
    assert "ConnectionResetError" in (outcome.interrupted_by or "")
    half = outcome.discarded[1]
    assert (half.id, half.name, half.arguments_text) == ("call_b", "deploy", '{"service": "ap')
    assert {d.id for d in outcome.discarded} == {"call_a", "call_b"}


def test_cancel_mid_stream_stops_reading_and_discards_the_half_call() -> None:
    token = CancelToken()
    consumed: list[int] = []

    def slow_stream() -> Iterator[dict[str, Any]]:
        for n, item in enumerate(two_interleaved_calls()):
            consumed.append(n)
            yield item
            if n == 1:
                token.cancel("user_stop")  # the stop arrives while the next chunk is awaited

    outcome = collect_tool_calls(slow_stream(), token=token)
    assert outcome.calls == []
    assert outcome.interrupted_by == "cancelled: user_stop"
    assert consumed == [0, 1, 2], (
        "the chunk that arrived after the stop is dropped; no more are read"
    )
    assert [d.arguments_text for d in outcome.discarded] == ['{"q": "ref', '{"service"']


def test_a_length_cut_off_is_an_interrupted_answer() -> None:
    chunks = [
        chunk(0, id="call_a", name="write_file", args='{"path": "/tmp/x", "body": "par'),
        finish("length"),
    ]
    outcome = collect_tool_calls(chunks)
    assert outcome.calls == []
    assert outcome.discarded[0].why == "finish_reason=length"


def test_partial_json_is_discarded_even_when_the_stream_ends_normally() -> None:
    chunks = [
        chunk(0, id="call_a", name="search", args='{"q": "ok"}'),
        chunk(1, id="call_b", name="deploy", args='{"service": '),
        finish(),
    ]
    outcome = collect_tool_calls(chunks)
    assert [c.id for c in outcome.calls] == ["call_a"]
    assert [d.id for d in outcome.discarded] == ["call_b"]
    assert "not complete JSON" in outcome.discarded[0].why
    json.dumps([d.__dict__ for d in outcome.discarded])  # discarded calls stay recordable as JSON


def test_a_call_without_arguments_means_an_empty_object() -> None:
    outcome = collect_tool_calls([chunk(0, id="call_a", name="now"), finish()])
    assert [(c.name, c.arguments) for c in outcome.calls] == [("now", {})]
