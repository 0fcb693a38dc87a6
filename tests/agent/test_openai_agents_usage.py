"""OpenAI Agents SDK: every model response's `usage` is reported as one `usage` event, with no
code in the agent: the top agent's (run and streamed), and an agent's run as a tool.

Scripted models (no network), the scripted `FakeApi` as the server.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from agent_fakes import FakeApi
from agents import Agent, RunConfig, RunHooks, function_tool, set_tracing_disabled

from safestop_agent import AgentRun, SafestopClient
from safestop_agent.integrations.openai_agents import (
    guard_agent,
    run_agent_streamed,
    run_agent_sync,
    stream_events,
)
from tests.support.scripted_model import ScriptedModel, call, say, spent

pytestmark = pytest.mark.timeout(60)
os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-never-used")
set_tracing_disabled(True)


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    return f"order {order}: 120 EUR"


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


def fields(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k not in ("event_id", "type")}


def two_turns(model: str = "gpt-4o") -> ScriptedModel:
    return ScriptedModel(
        [[call("lookup_order", {"order": "A-1"}, "call_1")], [say("It is 120 EUR.")]],
        usage=[spent(900, 20, cached=800), spent(960, 12)],
        model=model,
    )


def test_each_model_response_reports_its_usage_on_its_model_call_step(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    seen: list[int] = []

    class Mine(RunHooks[Any]):
        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            seen.append(response.usage.input_tokens)

    agent = guard_agent(Agent(name="support", tools=[lookup_order], model=two_turns()))
    with leased(client) as run:
        result = run_agent_sync(run, agent, "How much was A-1?", hooks=Mine())
    assert result.final_output == "It is 120 EUR."
    assert [fields(e) for e in fake_api.events_of_type("usage")] == [
        {
            "model": "gpt-4o",
            "input_tokens": 900,
            "output_tokens": 20,
            "cache_read_tokens": 800,
            "step_key": "model#1",
        },
        {"model": "gpt-4o", "input_tokens": 960, "output_tokens": 12, "step_key": "model#2"},
    ]
    assert seen == [900, 960], "the caller's own hooks still see every response"
    first, second = fake_api.events_of_type("usage")
    assert first["event_id"] != second["event_id"]


def test_the_same_response_reported_again_keeps_its_event_id(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    agent = guard_agent(Agent(name="support", tools=[lookup_order], model=two_turns()))
    with leased(client) as run:
        run_agent_sync(run, agent, "How much was A-1?")
    with leased(client) as run:  # another process, the same provider responses
        run_agent_sync(
            run, guard_agent(Agent(name="s", tools=[lookup_order], model=two_turns())), "?"
        )
    ids = [e["event_id"] for e in fake_api.events_of_type("usage")]
    assert len(ids) == 4 and ids[:2] == ids[2:], "named by the response id: counted once"


def test_a_streamed_run_and_the_run_configs_model_name(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    agent = guard_agent(Agent(name="support", tools=[lookup_order], model=two_turns("scripted")))

    async def stream(run: AgentRun) -> None:
        config = RunConfig(model=two_turns("gpt-4o-mini"))
        result = run_agent_streamed(run, agent, "How much was A-1?", run_config=config)
        async for _event in stream_events(run, result):
            pass

    with leased(client) as run:
        asyncio.run(stream(run))
    assert [
        (e["model"], e["input_tokens"], e["step_key"]) for e in fake_api.events_of_type("usage")
    ] == [
        ("gpt-4o-mini", 900, "model#1"),
        ("gpt-4o-mini", 960, "model#2"),
    ]


def test_an_agent_run_as_a_tool_reports_its_own_model_calls(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    billing = Agent(
        name="billing",
        model=ScriptedModel([[say("Refund booked.")]], usage=[spent(300, 9)], model="gpt-4.1-mini"),
    )
    manager_model = ScriptedModel(
        [[call("billing", {"input": "refund A-1"}, "call_billing")], [say("Done.")]],
        usage=[spent(500, 15), spent(540, 4)],
        model="gpt-4o",
    )
    manager = Agent(
        name="manager",
        tools=[billing.as_tool(tool_name="billing", tool_description="Billing")],
        model=manager_model,
    )
    with leased(client) as run:
        run_agent_sync(run, guard_agent(manager), "Refund A-1")
    reported = sorted((e["model"], e["input_tokens"]) for e in fake_api.events_of_type("usage"))
    assert reported == [("gpt-4.1-mini", 300), ("gpt-4o", 500), ("gpt-4o", 540)]


def test_a_response_that_used_no_tokens_reports_nothing(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    model = ScriptedModel([[say("Hi.")]])  # no usage said
    with leased(client) as run:
        run_agent_sync(run, guard_agent(Agent(name="support", model=model)), "Hello")
    assert fake_api.events_of_type("usage") == []
