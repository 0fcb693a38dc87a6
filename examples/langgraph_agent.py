"""A LangGraph graph that a reviewer can stop, resume and approve from the safestop console.

    pip install './agent[langgraph]'
    SAFESTOP_URL=http://127.0.0.1:8000 SAFESTOP_TOKEN=<agent token> python examples/langgraph_agent.py

Each node is a step in the console. The refund waits for a reviewer (Approvals page): approve
it (or edit the amount) and the graph goes on with the final arguments; reject it and the reply
says why. Press Stop while it works: the graph ends at the next node or tool boundary, its state
checkpointed; press Resume and run this again with the run id (`python
examples/langgraph_agent.py <run id>`): it continues from the checkpoint. (This example keeps
checkpoints in a SQLite file beside it when `langgraph-checkpoint-sqlite` is installed, so a
second process finds them; otherwise in memory, and a resume starts the thread over.)
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from safestop_agent import ApprovalRejected, SafestopClient
from safestop_agent.integrations.langgraph import SafestopGraph, current_token, safestop_tool


class Ticket(TypedDict, total=False):
    order: str
    amount: int
    status: str
    reply: str


@safestop_tool
def lookup_order(order: str) -> dict[str, Any]:
    return {"order": order, "paid": 120, "delivered": False}


@safestop_tool(
    side_effect="write",
    needs_approval=True,
    risk="high",
    recovery_policy="query_original",
    summary=lambda args: f"Refund {args['amount']} EUR on order {args['order']}",
)
def refund(order: str, amount: int) -> str:
    current_token().wait(1)  # stands in for the payment provider; a stop cuts it short
    current_token().raise_if_cancelled()  # stopped mid-refund: reported `unknown`, not `failed`
    return f"refund-{order}-{amount}"


def investigate(state: Ticket) -> Ticket:
    found = lookup_order(state["order"])
    current_token().wait(1)  # a slow look at the order: press Stop now to try it
    return {"amount": found["paid"], "status": "undelivered"}


def settle(state: Ticket) -> Ticket:
    try:
        receipt = refund(order=state["order"], amount=state["amount"])
    except ApprovalRejected as no:
        return {"status": "refused", "reply": f"No refund: {no.message or no.status}"}
    return {"status": "refunded", "reply": f"Refunded ({receipt})."}


def build_graph() -> Any:
    builder = StateGraph(Ticket)
    builder.add_node("investigate", investigate)
    builder.add_node("settle", settle)
    builder.add_edge(START, "investigate")
    builder.add_edge("investigate", "settle")
    builder.add_edge("settle", END)
    return builder.compile(checkpointer=_checkpointer())


def _checkpointer() -> Any:
    try:
        import sqlite3

        from langgraph.checkpoint.sqlite import SqliteSaver
    except ImportError:
        return InMemorySaver()
    path = os.environ.get("SAFESTOP_EXAMPLE_CHECKPOINTS", "langgraph_checkpoints.sqlite3")
    return SqliteSaver(sqlite3.connect(path, check_same_thread=False))


def main() -> int:
    client = SafestopClient(os.environ["SAFESTOP_URL"], os.environ["SAFESTOP_TOKEN"])
    steps = [{"key": "investigate#1", "name": "investigate"}, {"key": "settle#2", "name": "settle"}]
    run_id = (
        sys.argv[1]
        if len(sys.argv) > 1
        else client.create_run("Refund order 1042", "langgraph-example", steps=steps)["id"]
    )
    print(f"run {run_id}: open it in the console; approve the refund on the Approvals page")
    graph = build_graph()
    with client.lease(run_id, f"{socket.gethostname()}-{os.getpid()}", ttl_seconds=15) as run:
        outcome = SafestopGraph(run, graph).invoke({"order": "1042"})
        run.complete({"status": outcome.values["status"], "reply": outcome.values["reply"]})
    if run.token.cancelled:
        print(f"stopped ({run.token.reason}); checkpointed, press Resume and run me with {run_id}")
    else:
        print(f"completed: {outcome.values['reply']}")
    client.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
