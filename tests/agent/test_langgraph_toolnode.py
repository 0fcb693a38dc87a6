"""Parallel tool calls under LangGraph's prebuilt `ToolNode`: each call keeps its own permit.

A model node asks `lookup` and `send_email` in one message (LangGraph runs them in parallel
threads); `send_email` waits for a reviewer, who edits its arguments. The server is
`PermitLedger`, which (like the real server) answers a repeated `tool_call_id` with what that
id was first granted: a client that names two calls alike runs one tool with the other's
permit and arguments. Each tool sleeps a random while, so the calls finish in any order.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from agent_fakes import FakeApi, PermitLedger
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from safestop_agent import AgentRun, SafestopClient
from safestop_agent.integrations.langgraph import SafestopGraph, SafestopToolNode, safestop_tool

pytestmark = pytest.mark.timeout(120)

ITERATIONS = 50


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


def model_asking_both(i: int) -> Callable[[MessagesState], dict[str, Any]]:
    def model(state: MessagesState) -> dict[str, Any]:
        calls = [
            {"name": "lookup", "args": {"q": f"order-{i}"}, "id": f"call_lookup_{i}"},
            {"name": "send_email", "args": {"to": f"user{i}@x.test"}, "id": f"call_mail_{i}"},
        ]
        random.shuffle(calls)  # the model names them in either order
        return {"messages": [AIMessage(content="", tool_calls=calls)]}

    return model


def graph_with(tools_node: Any, i: int) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("model", model_asking_both(i))
    builder.add_node("tools", tools_node)
    builder.add_edge(START, "model")
    builder.add_edge("model", "tools")
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=InMemorySaver())


class Ran:
    """What each tool body was called with, across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def add(self, name: str, **arguments: Any) -> None:
        time.sleep(random.uniform(0, 0.01))  # variable latency in each tool
        with self.lock:
            self.calls.append((name, arguments))


def run_iteration(
    client: SafestopClient, fake_api: FakeApi, tools_node: Any, i: int
) -> tuple[PermitLedger, dict[str, str]]:
    ledger = PermitLedger(fake_api, held={"send_email"})
    graph = graph_with(tools_node, i)
    with leased(client) as run:
        adapter = SafestopGraph(run, graph, thread_id=f"t{i}", wait_for_approvals=False)
        waiting = adapter.invoke({"messages": [("user", "go")]})
        assert waiting.status == "waiting_for_approval", waiting
        (approval,) = ledger.waiting()
        assert approval["tool"] == "send_email"
        ledger.decide(approval["id"], "approved", arguments={"to": f"edited{i}@x.test"})
        outcome = adapter.invoke()
    assert outcome.status == "completed"
    replies = {
        m.tool_call_id: str(m.content)
        for m in outcome.values["messages"]
        if isinstance(m, ToolMessage)
    }
    return ledger, replies


def test_safestop_tool_node_keeps_each_parallel_call_with_its_own_permit(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    ran = Ran()

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        ran.add("lookup", q=q)
        return f"found {q}"

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        ran.add("send_email", to=to)
        return f"sent to {to}"

    node = SafestopToolNode([lookup, send_email], writes={"send_email"})
    for i in range(ITERATIONS):
        ran.calls.clear()
        ledger, replies = run_iteration(client, fake_api, node, i)
        assert ledger.conflicts() == {}, "no id was asked for two different calls"
        assert sorted(ran.calls, key=lambda c: c[0]) == [
            ("lookup", {"q": f"order-{i}"}),
            ("send_email", {"to": f"edited{i}@x.test"}),
        ], "each tool ran once, with its own (approved) arguments"
        assert replies == {
            f"call_lookup_{i}": f"found order-{i}",
            f"call_mail_{i}": f"sent to edited{i}@x.test",
        }
        # The permits are named by the model's call ids, at the lease's epoch.
        assert set(ledger.calls) == {f"call_lookup_{i}.e3", f"call_mail_{i}.e3"}
        assert ledger.calls[f"call_mail_{i}.e3"]["tool"] == "send_email"


def test_guarded_functions_in_a_plain_tool_node_never_trade_permits(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    """The fallback for calls that carry no framework id: `@safestop_tool` functions called
    from LangChain tools that a plain `ToolNode` runs in parallel."""
    ran = Ran()

    @safestop_tool(name="lookup")
    def _lookup(q: str) -> str:
        ran.add("lookup", q=q)
        return f"found {q}"

    @safestop_tool(name="send_email", side_effect="write")
    def _send_email(to: str) -> str:
        ran.add("send_email", to=to)
        return f"sent to {to}"

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        time.sleep(random.uniform(0, 0.01))  # which guarded call asks first varies
        return _lookup(q)

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        time.sleep(random.uniform(0, 0.01))
        return _send_email(to)

    node = ToolNode([lookup, send_email])
    for i in range(ITERATIONS):
        ran.calls.clear()
        ledger, replies = run_iteration(client, fake_api, node, i)
        assert ledger.conflicts() == {}, "no id was asked for two different calls"
        assert sorted(ran.calls, key=lambda c: c[0]) == [
            ("lookup", {"q": f"order-{i}"}),
            ("send_email", {"to": f"edited{i}@x.test"}),
        ]
        assert replies[f"call_lookup_{i}"] == f"found order-{i}"


def test_unknown_tool_names_are_refused() -> None:
    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        return q

    with pytest.raises(ValueError, match=r"no tool named \['refund'\]"):
        SafestopToolNode([lookup], writes={"refund"})
