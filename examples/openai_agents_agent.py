"""An OpenAI Agents SDK agent that a reviewer can stop and approve from the safestop console.

    pip install './agent[openai-agents]'
    SAFESTOP_URL=http://127.0.0.1:8000 SAFESTOP_TOKEN=<agent token> python examples/openai_agents_agent.py

Every tool call asks safestop first. The refund waits for a reviewer (Approvals page): approve
it (or edit the amount) and it runs with the final arguments; reject it and the model reads the
reviewer's message as the tool's output. Press Stop while it works and the run is cancelled:
nothing new starts, a refund in flight is reported `unknown`.

With OPENAI_API_KEY set it uses a real model (`SAFESTOP_EXAMPLE_MODEL`, default gpt-4.1-mini);
without one a scripted model plays the same conversation, so the example runs offline.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled
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

from safestop_agent import SafestopClient
from safestop_agent.integrations.openai_agents import guard_agent, run_agent_sync


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up: what was paid and whether it was delivered."""
    return json.dumps({"order": order, "paid": 120, "delivered": False})


@function_tool(needs_approval=True)  # safestop puts it before a reviewer
async def refund(order: str, amount: int) -> str:
    """Refund part or all of an order."""
    await asyncio.sleep(1)  # the payment provider; a stop now leaves it `unknown`
    return f"refunded {amount} EUR on order {order}"


class ScriptedModel(Model):
    """Stands in for a real model offline: looks the order up, refunds it, answers."""

    def __init__(self) -> None:
        self.turn = 0

    def _output(self, input: Any) -> list[Any]:
        self.turn += 1
        if self.turn == 1:
            return [_call("lookup_order", {"order": "1042"}, "call_lookup")]
        if self.turn == 2:
            return [_call("refund", {"order": "1042", "amount": 120}, "call_refund")]
        outputs = [
            item["output"]
            for item in input
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        return [_say(f"Done: {outputs[-1]}")]

    async def get_response(self, system_instructions, input, *args, **kwargs):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.5)  # thinking
        return ModelResponse(output=self._output(input), usage=Usage(), response_id=None)

    async def stream_response(
        self, system_instructions, input, *args, **kwargs
    ) -> AsyncIterator[Any]:  # type: ignore[no-untyped-def]  # noqa: E501
        response = Response(
            id="scripted",
            created_at=0,
            model="scripted",
            object="response",
            output=self._output(input),
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


def _call(name: str, arguments: dict[str, Any], call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=call_id,
        call_id=call_id,
        type="function_call",
        name=name,
        arguments=json.dumps(arguments),
    )


def _say(text: str) -> ResponseOutputMessage:
    content = [ResponseOutputText(text=text, type="output_text", annotations=[])]
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed", content=content
    )


def build_agent() -> Agent[Any]:
    if os.environ.get("OPENAI_API_KEY"):
        model: Any = os.environ.get("SAFESTOP_EXAMPLE_MODEL", "gpt-4.1-mini")
    else:
        set_tracing_disabled(True)
        model = ScriptedModel()
    agent = Agent(
        name="support",
        instructions="Look the order up; refund undelivered orders in full.",
        tools=[lookup_order, refund],
        model=model,
    )
    return guard_agent(
        agent,
        writes={"refund"},
        risk={"refund": "high"},
        summaries={"refund": lambda args: f"Refund {args['amount']} EUR on order {args['order']}"},
    )


def main() -> int:
    client = SafestopClient(os.environ["SAFESTOP_URL"], os.environ["SAFESTOP_TOKEN"])
    run_id = client.create_run("Refund order 1042", "openai-agents-example")["id"]
    print(f"run {run_id}: open it in the console; approve the refund on the Approvals page")
    with client.lease(run_id, f"{socket.gethostname()}-{os.getpid()}", ttl_seconds=15) as run:
        result = run_agent_sync(run, build_agent(), "Order 1042 never arrived.")
        run.complete({"answer": str(result.final_output)})
    if run.token.cancelled:
        print(f"stopped ({run.token.reason}); drained and handed back")
    else:
        print(f"completed: {result.final_output}")
    client.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
