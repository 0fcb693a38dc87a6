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
)


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


class ScriptedModel(Model):
    """Plays `turns` in order and records each input; `hold={turn: seconds}` makes a turn
    think that long first (so a stop can land while the model works)."""

    def __init__(self, turns: list[list[Any]], hold: dict[int, float] | None = None) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []
        self.hold = hold or {}

    async def _next(self, input: Any) -> list[Any]:
        self.inputs.append(input)
        turn = len(self.inputs)
        if turn in self.hold:
            await asyncio.sleep(self.hold[turn])
        if not self.turns:
            raise AssertionError(f"the model was called a {turn}th time")
        return self.turns.pop(0)

    async def get_response(self, system_instructions, input, *args, **kwargs):  # type: ignore[no-untyped-def]
        return ModelResponse(output=await self._next(input), usage=Usage(), response_id=None)

    async def stream_response(
        self, system_instructions, input, *args, **kwargs
    ) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]  # noqa: E501
        response = Response(
            id="resp",
            created_at=0,
            model="scripted",
            object="response",
            output=await self._next(input),
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
            status="completed",
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
