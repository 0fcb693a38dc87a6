"""Usage reported by the adapters by themselves, against a live server: the run's cost and
tokens show what the scripted models said they used, per step and per model.

The models are scripted (no network); the prices are the server's own table.
"""

from __future__ import annotations

import os
from decimal import Decimal
from typing import Any

import pytest
from agents import Agent, function_tool, set_tracing_disabled
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from runs.models import Run, RunStatus, Usage
from safestop_agent.integrations.langgraph import SafestopGraph
from safestop_agent.integrations.openai_agents import guard_agent, run_agent_sync
from tests.support.scripted_model import ScriptedModel, call, say, spent
from tests.support.stack import leased, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-never-used")
set_tracing_disabled(True)


def said(text: str, model: str, tokens_in: int, tokens_out: int) -> AIMessage:
    return AIMessage(
        content=text,
        response_metadata={"model_name": model},
        usage_metadata={
            "input_tokens": tokens_in,
            "output_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
        },
    )


def test_langgraph_model_calls_show_as_cost_on_the_run(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("LangGraph usage", "lg-bot")["id"]
    model = GenericFakeChatModel(
        messages=iter(
            [said("plan", "gpt-4o", 2000, 100), said("draft", "a-model-nobody-prices", 300, 40)]
        )
    )

    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("plan", node)
    builder.add_node("write", node)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "write")
    builder.add_edge("write", END)
    graph = builder.compile(checkpointer=InMemorySaver())

    with leased(client, run_id) as run:
        SafestopGraph(run, graph).invoke({"messages": [HumanMessage("hi")]})
        run.complete({"ok": True})
    wait_status(run_id, RunStatus.COMPLETED)

    shown = reviewer.get_run(run_id)
    assert shown["tokens"] == {"input": 2300, "output": 140, "total": 2440}
    assert shown["unpriced_tokens"] == 340, "the unknown model is unpriced, never $0"
    assert Decimal(str(shown["cost_usd"])) > 0
    rows = {u.step_key: (u.model, u.price_source) for u in Usage.objects.filter(run_id=run_id)}
    assert rows == {
        "plan#1": ("gpt-4o", "table"),
        "write#2": ("a-model-nobody-prices", "unpriced"),
    }


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    return f"order {order}: 120 EUR"


def test_openai_agents_model_responses_show_as_cost_on_the_run(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("Agents SDK usage", "sdk-bot")["id"]
    model = ScriptedModel(
        [[call("lookup_order", {"order": "1042"}, "call_1")], [say("120 EUR.")]],
        usage=[spent(1500, 30, cached=1000), spent(1600, 10)],
        model="gpt-4o",
    )
    agent = guard_agent(Agent(name="support", tools=[lookup_order], model=model))
    with leased(client, run_id) as run:
        result = run_agent_sync(run, agent, "How much was 1042?")
        run.complete({"answer": result.final_output})
    wait_status(run_id, RunStatus.COMPLETED)

    shown = reviewer.get_run(run_id)
    assert shown["tokens"] == {"input": 3100, "output": 40, "total": 3140}
    assert shown["unpriced_tokens"] == 0
    assert Decimal(str(shown["cost_usd"])) > 0
    rows = list(Usage.objects.filter(run_id=run_id).order_by("id"))
    assert [(u.step_key, u.cache_read_tokens) for u in rows] == [("model#1", 1000), ("model#2", 0)]
    assert Run.objects.get(pk=run_id).cost_usd == sum(u.cost_usd for u in rows)
