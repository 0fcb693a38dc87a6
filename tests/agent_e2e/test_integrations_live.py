"""The LangGraph and OpenAI Agents SDK adapters against a live server, for the three things
that matter to a runtime that embeds them:

1. a stop reaches the running work within the push latency, and nothing new starts after it;
2. a write in flight at the stop is reported `unknown`, never `failed`;
3. a waiting approval decided by a reviewer (`POST /api/v1/approvals/{id}/decide/`) resumes
   the work with the final arguments.

The worker runs in a thread of this process with the real frameworks (plain LangGraph nodes, a
scripted model for the SDK); the server is daphne with its background loop on the test
database. Stops and decisions go through the server's HTTP API, so they reach the worker by
push. The runnable examples are run the same way, as their own processes.
"""

from __future__ import annotations

import asyncio
import operator
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from agents import Agent, function_tool, set_tracing_disabled
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph

from runs.models import ExecutionRecord, ExecutionState, Run, RunStatus, Step
from safestop_agent import AgentRun, SafestopClient
from safestop_agent.integrations.langgraph import SafestopGraph, current_token, safestop_tool
from safestop_agent.integrations.openai_agents import guard_agent, run_agent_sync
from tests.support.scripted_model import ScriptedModel, call, say
from tests.support.stack import WorkerThread, leased, wait_status, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-never-used")
set_tracing_disabled(True)

REPO = Path(__file__).resolve().parents[2]
PUSH_LATENCY = 1.0  # seconds from the stop request to the worker's token, cancel POST included


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    receipt: str


def line(nodes: dict[str, Callable[[State], Any]]) -> Any:
    builder = StateGraph(State)
    names = list(nodes)
    for name, fn in nodes.items():
        builder.add_node(name, fn)
    builder.add_edge(START, names[0])
    for first, second in zip(names, names[1:], strict=False):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=InMemorySaver())


def stamp_on_cancel(run: AgentRun, into: dict[str, float]) -> None:
    run.token.on_cancel(lambda: into.setdefault("cancelled", time.perf_counter()))


def stop(reviewer: SafestopClient, run_id: str) -> float:
    sent = time.perf_counter()
    reviewer.cancel(run_id, "user_stop", note="stop from the test")
    return sent


def waiting_approval(reviewer: SafestopClient, run_id: str) -> dict[str, Any]:
    def listed() -> dict[str, Any] | None:
        # a list summarises the arguments: read the one approval whole
        rows = reviewer.list_approvals(status="waiting", run=run_id)
        return dict(reviewer.get_approval(rows[0]["id"])) if len(rows) == 1 else None

    return wait_until(listed, timeout=15, interval=0.05, what=f"an approval waiting on {run_id}")


def record(run_id: str, tool: str) -> ExecutionRecord:
    return ExecutionRecord.objects.get(run_id=run_id, tool=tool)


# -- LangGraph ---------------------------------------------------------------------------


def test_langgraph_stop_ends_the_graph_at_the_node_boundary_and_resume_goes_on(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("LangGraph stop", "lg-bot")["id"]
    working, ran, at = threading.Event(), [], {}

    def slow(state: State) -> State:
        ran.append("slow")
        working.set()
        current_token().wait(30)  # a long node that watches the token
        return {"log": ["slow"]}

    def after(state: State) -> State:
        ran.append("after")
        return {"log": ["after"]}

    graph = line({"slow": slow, "after": after})

    def work() -> None:
        with leased(client, run_id) as run:
            stamp_on_cancel(run, at)
            SafestopGraph(run, graph).invoke({"log": []})

    worker = WorkerThread(work)
    worker.start()
    assert working.wait(10)
    sent = stop(reviewer, run_id)
    worker.outcome(15)
    assert at["cancelled"] - sent < PUSH_LATENCY
    assert ran == ["slow"], "nothing new started after the stop"
    stopped = wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    assert stopped.resume_from.startswith("langgraph:")
    assert not Step.objects.filter(run_id=run_id, key__startswith="after").exists()
    assert Step.objects.get(run_id=run_id, key="slow#1").status == "completed"

    reviewer.resume(run_id, note="go on")
    with leased(client, run_id, worker_id="worker-2") as run:
        outcome = SafestopGraph(run, graph).invoke()
        run.complete(outcome.values)
    assert ran == ["slow", "after"] and outcome.values["log"] == ["slow", "after"]
    wait_status(run_id, RunStatus.COMPLETED)
    assert Step.objects.get(run_id=run_id, key="after#2").status == "completed"


def test_langgraph_write_in_flight_at_the_stop_is_unknown(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("LangGraph write", "lg-bot")["id"]
    writing = threading.Event()

    @safestop_tool(side_effect="write", recovery_policy="query_original")
    def transfer(amount: int) -> str:
        writing.set()
        current_token().wait(30)  # the bank has the request; the stop lands before its answer
        current_token().raise_if_cancelled()
        return "done"  # pragma: no cover

    graph = line({"pay": lambda state: {"receipt": transfer(300)}})

    def work() -> None:
        with leased(client, run_id) as run:
            SafestopGraph(run, graph).invoke({"log": []})

    worker = WorkerThread(work)
    worker.start()
    assert writing.wait(10)
    stop(reviewer, run_id)
    worker.outcome(15)
    assert record(run_id, "transfer").execution_state == ExecutionState.UNKNOWN
    wait_status(run_id, RunStatus.STOPPED_CLEANLY, RunStatus.STOPPED_DIRTY)


def test_langgraph_approval_decided_by_a_reviewer_resumes_with_the_final_arguments(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("LangGraph approval", "lg-bot")["id"]
    refunded: list[tuple[str, int]] = []

    @safestop_tool(side_effect="write", needs_approval=True, risk="high", summary="Refund")
    def refund(order: str, amount: int) -> str:
        refunded.append((order, amount))
        return f"refunded {amount}"

    graph = line({"settle": lambda state: {"receipt": refund(order="1042", amount=120)}})

    def work() -> Any:
        with leased(client, run_id) as run:
            outcome = SafestopGraph(run, graph).invoke({"log": []})
            run.complete(outcome.values)
            return outcome

    worker = WorkerThread(work)
    worker.start()
    approval = waiting_approval(reviewer, run_id)
    # While it waits the graph is paused at a LangGraph interrupt, not inside the node.
    # (the server holds the call a moment before the node raises its interrupt)
    thread = {"configurable": {"thread_id": f"safestop-{run_id}"}}
    paused = wait_until(
        lambda: (state := graph.get_state(thread)).interrupts and state,
        timeout=10,
        what="the graph paused at its interrupt",
    )
    assert paused.next == ("settle",) and refunded == []
    reviewer.decide_approval(
        approval["id"], "approve", message="capped", arguments={"order": "1042", "amount": 90}
    )
    outcome = worker.outcome(15)
    assert refunded == [("1042", 90)] and outcome.values["receipt"] == "refunded 90"
    assert record(run_id, "refund").execution_state == ExecutionState.SUCCEEDED
    wait_status(run_id, RunStatus.COMPLETED)


# -- OpenAI Agents SDK -------------------------------------------------------------------


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    return f"order {order}: 120 EUR, not delivered"


def test_openai_agents_stop_cancels_the_run_and_nothing_new_starts(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("Agents SDK stop", "sdk-bot")["id"]
    model = ScriptedModel(
        [
            [call("lookup_order", {"order": "1"}, "call_1")],
            [call("lookup_order", {"order": "2"}, "call_2")],
            [say("never")],
        ],
        hold={2: 30.0},  # the second model call thinks for a long time
    )
    agent = guard_agent(Agent(name="support", tools=[lookup_order], model=model))
    at: dict[str, float] = {}

    def work() -> None:
        with leased(client, run_id) as run:
            stamp_on_cancel(run, at)
            run_agent_sync(run, agent, "Look up orders 1 and 2")

    worker = WorkerThread(work)
    worker.start()
    wait_until(lambda: len(model.inputs) == 2, timeout=10, what="the second model call")
    sent = stop(reviewer, run_id)
    worker.outcome(15)
    assert at["cancelled"] - sent < PUSH_LATENCY
    assert len(model.inputs) == 2, "no model call after the stop"
    assert list(
        ExecutionRecord.objects.filter(run_id=run_id).values_list("tool_call_id", flat=True)
    ) == ["call_1.e1"]
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)


def test_openai_agents_write_in_flight_at_the_stop_is_unknown(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("Agents SDK write", "sdk-bot")["id"]
    writing = threading.Event()

    @function_tool
    async def transfer(amount: int) -> str:
        """Move money."""
        writing.set()
        await asyncio.sleep(30)  # the bank works; the stop cancels the run meanwhile
        return "moved"  # pragma: no cover

    model = ScriptedModel([[call("transfer", {"amount": 300}, "call_t")], [say("never")]])
    agent = guard_agent(Agent(name="bank", tools=[transfer], model=model), writes={"transfer"})

    def work() -> None:
        with leased(client, run_id) as run:
            run_agent_sync(run, agent, "Move 300")

    worker = WorkerThread(work)
    worker.start()
    assert writing.wait(10)
    stop(reviewer, run_id)
    worker.outcome(15)
    transfer_record = record(run_id, "transfer")
    assert transfer_record.execution_state == ExecutionState.UNKNOWN
    assert transfer_record.recovery_policy == "manual_confirmation"
    wait_status(run_id, RunStatus.STOPPED_CLEANLY, RunStatus.STOPPED_DIRTY)


def test_openai_agents_approval_decided_by_a_reviewer_resumes_with_the_final_arguments(stack):
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run("Agents SDK approval", "sdk-bot")["id"]
    refunded: list[tuple[str, int]] = []

    @function_tool(needs_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        refunded.append((order, amount))
        return f"refunded {amount} EUR"

    model = ScriptedModel(
        [[call("refund", {"order": "1042", "amount": 120}, "call_r")], [say("Refunded.")]]
    )
    agent = guard_agent(Agent(name="support", tools=[refund], model=model), writes={"refund"})

    def work() -> Any:
        with leased(client, run_id) as run:
            result = run_agent_sync(run, agent, "Refund 1042")
            run.complete({"answer": result.final_output})
            return result

    worker = WorkerThread(work)
    worker.start()
    approval = waiting_approval(reviewer, run_id)
    assert approval["original_arguments"] == {"order": "1042", "amount": 120}
    reviewer.decide_approval(approval["id"], "approve", arguments={"order": "1042", "amount": 90})
    result = worker.outcome(15)
    assert refunded == [("1042", 90)]
    assert model.tool_outputs() == ["refunded 90 EUR"] and result.final_output == "Refunded."
    assert record(run_id, "refund").execution_state == ExecutionState.SUCCEEDED
    wait_status(run_id, RunStatus.COMPLETED)


# -- the runnable examples ---------------------------------------------------------------


def run_example(stack: Any, script: str, tmp_path: Path) -> subprocess.Popen[str]:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "DATABASE_URL")},
        "SAFESTOP_URL": stack.url,
        "SAFESTOP_TOKEN": stack.agent_raw,
        "SAFESTOP_EXAMPLE_CHECKPOINTS": str(tmp_path / "checkpoints.sqlite3"),
    }
    return subprocess.Popen(
        [sys.executable, str(REPO / "examples" / script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def first_line_run_id(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("run "), first
    return first.split()[1].rstrip(":")


@pytest.mark.parametrize(
    ("script", "tool"),
    [("langgraph_agent.py", "refund"), ("openai_agents_agent.py", "refund")],
)
def test_the_example_runs_and_a_reviewer_approves_its_refund(stack, tmp_path, script, tool):
    reviewer = stack.reviewer()
    process = run_example(stack, script, tmp_path)
    try:
        run_id = first_line_run_id(process)
        approval = waiting_approval(reviewer, run_id)
        assert approval["tool"] == tool and approval["risk"] == "high"
        reviewer.decide_approval(
            approval["id"], "approve", arguments={**approval["original_arguments"], "amount": 80}
        )
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert "completed" in output and "80" in output, output
    assert Run.objects.get(pk=run_id).status == RunStatus.COMPLETED
    assert record(run_id, tool).execution_state == ExecutionState.SUCCEEDED
