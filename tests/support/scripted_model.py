"""A scripted model for the OpenAI Agents SDK: its `Model` interface, playing turns in order.

No network and no API key needed (set any dummy key and turn tracing off). Used by the
adapter's tests with fakes (tests/agent) and against a live server (tests/agent_e2e).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails


def call(name: str, arguments: str | dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    """The model asks for tool `name` with `arguments` (JSON text or a dict)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ResponseFunctionToolCall(
        id=call_id, call_id=call_id, type="function_call", name=name, arguments=text
    )


def say(text: str) -> ResponseOutputMessage:
    """The model answers `text` (a final output when it asks for no tool)."""
    return ResponseOutputMessage(
        id="msg",
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])],
    )


def spent(input_tokens: int, output_tokens: int, cached: int = 0) -> Usage:
    """What one turn used, as the SDK's `Usage` of a model response."""
    return Usage(
        requests=1,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        # `cache_write_tokens` is required by later openai releases; earlier ones keep it as extra.
        input_tokens_details=InputTokensDetails(cached_tokens=cached, cache_write_tokens=0),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )


class ScriptedModel(Model):
    """Plays `turns` in order and records each input; `hold={turn: seconds}` makes a turn
    think that long first (so a stop can land while the model works). `usage` (one `Usage`
    per turn) is what each turn's response says it used, `model` the name it goes by; each
    response gets the id `resp_<turn>` when it reports usage."""

    def __init__(
        self,
        turns: list[list[Any]],
        hold: dict[int, float] | None = None,
        *,
        usage: list[Usage] | None = None,
        model: str = "scripted",
    ) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []
        self.hold = hold or {}
        self.usage = list(usage or [])
        self.model = model

    def _usage(self) -> tuple[Usage, str | None]:
        turn = len(self.inputs)
        if turn <= len(self.usage):
            return self.usage[turn - 1], f"resp_{turn}"
        return Usage(), None

    async def _next(self, input: Any) -> list[Any]:
        self.inputs.append(input)
        turn = len(self.inputs)
        if turn in self.hold:
            await asyncio.sleep(self.hold[turn])
        if not self.turns:
            raise AssertionError(f"the model was called a {turn}th time")
        return self.turns.pop(0)

    async def get_response(self, system_instructions, input, *args, **kwargs):  # type: ignore[no-untyped-def]
        output = await self._next(input)
        usage, response_id = self._usage()
        return ModelResponse(output=output, usage=usage, response_id=response_id)

    async def stream_response(
        self, system_instructions, input, *args, **kwargs
    ) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]  # noqa: E501
        output = await self._next(input)
        usage, response_id = self._usage()
        response = Response(
            id=response_id or "resp",
            created_at=0,
            model=self.model,
            object="response",
            output=output,
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
            status="completed",
            usage=ResponseUsage(
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                total_tokens=usage.total_tokens,
                input_tokens_details=usage.input_tokens_details,
                output_tokens_details=usage.output_tokens_details,
            )
            if response_id
            else None,
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )

    def tool_outputs(self) -> list[str]:
        """The tool outputs the model was shown on its last turn."""
        return [
            item["output"]
            for item in self.inputs[-1]
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
