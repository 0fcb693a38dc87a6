"""LangGraph async (`ainvoke`, `astream`, async nodes and tools) and streaming to the caller."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest
from agent_fakes import FakeApi, PermitLedger
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from safestop_agent import AgentRun, Cancelled, SafestopClient
from safestop_agent.integrations.langgraph import (
    SafestopGraph,
    SafestopToolNode,
    current_token,
    safestop_tool,
)

pytestmark = pytest.mark.timeout(60)


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


def line(*nodes: tuple[str, Any]) -> Any:
    builder = StateGraph(State)
    for name, fn in nodes:
        builder.add_node(name, fn)
    names = [name for name, _fn in nodes]
    builder.add_edge(START, names[0])
    for first, second in zip(names, names[1:], strict=False):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=InMemorySaver())


@safestop_tool(side_effect="write")
async def charge(amount: int) -> str:
    await asyncio.sleep(0)
    return f"charged {amount}"


async def plan(state: State) -> State:
    await asyncio.sleep(0)
    return {"log": ["planned"]}


async def act(state: State) -> State:
    return {"log": [await charge(5)]}


def steps(api: FakeApi) -> list[tuple[str, str]]:
    return [
        (e["type"], e["key"])
        for batch in api.sent("events/")
        for e in batch["events"]
        if e["type"].startswith("step.")
    ]


def test_ainvoke_runs_async_nodes_and_async_tools(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    graph = line(("plan", plan), ("act", act))
    with leased(client) as run:
        outcome = asyncio.run(SafestopGraph(run, graph).ainvoke({"log": []}))
    assert outcome.status == "completed" and outcome.values["log"] == ["planned", "charged 5"]
    (permit,) = fake_api.sent("permits/")
    assert (permit["tool"], permit["side_effect"], permit["step_key"]) == (
        "charge",
        "write",
        "act#2",
    )
    assert steps(fake_api) == [
        ("step.started", "plan#1"),
        ("step.completed", "plan#1"),
        ("step.started", "act#2"),
        ("step.completed", "act#2"),
    ]


def test_stream_and_astream_hand_the_graphs_updates_to_the_caller(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    def sync_plan(state: State) -> State:
        return {"log": ["planned"]}

    sync_graph = line(("plan", sync_plan), ("done", lambda s: {"log": ["done"]}))
    with leased(client) as run:
        adapter = SafestopGraph(run, sync_graph)
        chunks = list(adapter.stream({"log": []}))
    assert chunks == [{"plan": {"log": ["planned"]}}, {"done": {"log": ["done"]}}]
    assert adapter.outcome is not None and adapter.outcome.status == "completed"

    async def collect(run: AgentRun) -> list[Any]:
        adapter = SafestopGraph(run, line(("plan", plan), ("act", act)), thread_id="async")
        return [chunk async for chunk in adapter.astream({"log": []}, stream_mode="values")]

    with leased(client) as run:
        values = asyncio.run(collect(run))
    assert values[-1] == {"log": ["planned", "charged 5"]}
    assert all("__interrupt__" not in v for v in values), "the adapter's pauses stay inside"


def test_a_stop_in_an_async_graph_ends_it_at_the_node_boundary(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    ran: list[str] = []

    async def first(state: State) -> State:
        ran.append("first")
        current_token().cancel("user_stop", stop_epoch=4)  # the push lands mid-node
        return {"log": ["first"]}

    async def second(state: State) -> State:
        ran.append("second")
        return {"log": ["second"]}

    graph = line(("first", first), ("second", second))
    with leased(client) as run:
        with pytest.raises(Cancelled):
            asyncio.run(SafestopGraph(run, graph).ainvoke({"log": []}))
        raise Cancelled("user_stop")  # the lease block drains, as it would have
    assert ran == ["first"], "the next node never ran"
    saved = fake_api.events_of_type("checkpoint.saved")
    assert [s["state"]["next"] for s in saved] == [["second"]]


def test_an_async_tool_node_waits_for_approval_and_keeps_each_call_its_permit(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    ledger = PermitLedger(fake_api, held={"send_email"})
    sent: list[str] = []
    looked: list[str] = []

    @tool
    async def lookup(q: str) -> str:
        """Look something up."""
        looked.append(q)
        await asyncio.sleep(0.05)  # still running when its sibling interrupts for approval
        return f"found {q}"

    @tool
    async def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    def model(state: MessagesState) -> dict[str, Any]:
        calls = [
            {"name": "send_email", "args": {"to": "a@x.test"}, "id": "call_mail"},
            {"name": "lookup", "args": {"q": "order"}, "id": "call_lookup"},
        ]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", SafestopToolNode([lookup, send_email], writes={"send_email"}))
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    graph = builder.compile(checkpointer=InMemorySaver())

    async def main(run: AgentRun) -> Any:
        adapter = SafestopGraph(run, graph, wait_for_approvals=False)
        waiting = await adapter.ainvoke({"messages": [("user", "go")]})
        assert waiting.status == "waiting_for_approval" and sent == []
        (approval,) = ledger.waiting()
        ledger.decide(approval["id"], "approved", arguments={"to": "b@x.test"})
        return await adapter.ainvoke()

    with leased(client) as run:
        outcome = asyncio.run(main(run))
    replies = {
        m.tool_call_id: m.content for m in outcome.values["messages"] if isinstance(m, ToolMessage)
    }
    assert replies == {"call_mail": "sent to b@x.test", "call_lookup": "found order"}
    assert sent == ["b@x.test"] and looked == ["order"], "each tool body ran once"
    assert ledger.conflicts() == {}
    assert [p["tool"] for p in fake_api.sent("permits/")].count("lookup") == 1, "ran once"
