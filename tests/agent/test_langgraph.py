"""`safestop_agent.integrations.langgraph` with the real `langgraph` package, against fakes.

Plain Python nodes (no model, no network): the server is the scripted `FakeApi`. The
live-server version is tests/agent_e2e/test_integrations_live.py.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from agent_fakes import ApprovalServer, FakeApi, refusal
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from safestop_agent import AgentRun, ApprovalRejected, SafestopClient
from safestop_agent.integrations.langgraph import (
    CHECKPOINT_PREFIX,
    SafestopGraph,
    current_token,
    safestop_tool,
    tool_call,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


def build(nodes: dict[str, Callable[[State], Any]], checkpointer: Any = None) -> Any:
    """A straight line through `nodes`, in order."""
    builder = StateGraph(State)
    names = list(nodes)
    for name, fn in nodes.items():
        builder.add_node(name, fn)
    builder.add_edge(START, names[0])
    for first, second in zip(names, names[1:], strict=False):
        builder.add_edge(first, second)
    builder.add_edge(names[-1], END)
    return builder.compile(checkpointer=checkpointer or InMemorySaver())


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


def events(api: FakeApi, *types: str) -> list[tuple[str, Any]]:
    return [
        (e["type"], e.get("key") or e.get("label"))
        for batch in api.sent("events/")
        for e in batch["events"]
        if e["type"] in types
    ]


def results(api: FakeApi) -> list[tuple[str, str]]:
    return [
        (path.split("/")[1], body["execution_state"])
        for path, body in api.sent_matching("tool-calls/")
    ]


# -- steps -------------------------------------------------------------------------------


def test_each_node_is_a_step_and_the_graph_completes(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    graph = build({name: (lambda state, n=name: {"log": [n]}) for name in ("plan", "act", "sum")})
    with leased(client) as run:
        outcome = SafestopGraph(run, graph).invoke({"log": []})
        run.complete(outcome.values)
    assert outcome.status == "completed" and outcome.values["log"] == ["plan", "act", "sum"]
    assert events(fake_api, "step.started", "step.completed") == [
        ("step.started", "plan#1"),
        ("step.completed", "plan#1"),
        ("step.started", "act#2"),
        ("step.completed", "act#2"),
        ("step.started", "sum#3"),
        ("step.completed", "sum#3"),
    ]
    assert outcome.thread_id == "safestop-run_1"


def test_a_failing_node_is_a_failed_step_and_the_error_propagates(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    def broken(state: State) -> State:
        raise ValueError("bad input")

    graph = build({"plan": lambda s: {"log": ["plan"]}, "broken": broken})
    with pytest.raises(ValueError), leased(client) as run:
        SafestopGraph(run, graph).invoke({"log": []})
    failed = [
        e for b in fake_api.sent("events/") for e in b["events"] if e["type"] == "step.failed"
    ]
    assert [(e["key"], "bad input" in e["error"]) for e in failed] == [("broken#2", True)]


def test_a_graph_without_a_checkpointer_is_refused(client: SafestopClient) -> None:
    builder = StateGraph(State)
    builder.add_node("only", lambda s: {})
    builder.add_edge(START, "only")
    with pytest.raises(ValueError, match="checkpointer"):
        SafestopGraph(leased(client), builder.compile())


def test_a_tool_call_outside_a_running_graph_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="no safestop graph is running"):
        tool_call("search", {"q": "x"}, lambda q: q)


# -- tool calls --------------------------------------------------------------------------


@safestop_tool
def lookup(order: str) -> str:
    return f"order {order}: shipped"


@safestop_tool(side_effect="write", recovery_policy="query_original")
def refund(order: str, amount: int) -> str:
    return f"refunded {amount} on {order}"


def test_tool_calls_in_nodes_ask_permits_and_report_results(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    def research(state: State) -> State:
        return {"log": [lookup("A-1")]}

    def act(state: State) -> State:
        return {"log": [refund(order="A-1", amount=30)]}

    with leased(client) as run:
        outcome = SafestopGraph(run, build({"research": research, "act": act})).invoke({"log": []})
    assert outcome.values["log"] == ["order A-1: shipped", "refunded 30 on A-1"]
    permits = fake_api.sent("permits/")
    assert [(p["tool"], p["side_effect"], p["step_key"], p["arguments"]) for p in permits] == [
        ("lookup", "none", "research#1", {"order": "A-1"}),
        ("refund", "write", "act#2", {"order": "A-1", "amount": 30}),
    ]
    assert permits[1]["recovery_policy"] == "query_original"
    assert [state for _id, state in results(fake_api)] == ["succeeded", "succeeded"]


# -- stops -------------------------------------------------------------------------------


def test_a_stop_between_nodes_ends_the_graph_checkpointed_and_resume_goes_on(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    ran: list[str] = []
    checkpointer = InMemorySaver()

    def node(name: str) -> Callable[[State], State]:
        def run_node(state: State) -> State:
            ran.append(name)
            if name == "b" and len(ran) == 2:
                current_token().cancel("user_stop", stop_epoch=4)  # the push arrives mid-node
            return {"log": [name]}

        return run_node

    graph = build({name: node(name) for name in "abc"}, checkpointer)
    with leased(client) as run:
        SafestopGraph(run, graph).invoke({"log": []})
        pytest.fail("a stopped graph raises Cancelled")  # pragma: no cover
    assert ran == ["a", "b"], "c never started"
    assert fake_api.sent("drained/"), "the lease block drained"
    checkpoints = [
        e for b in fake_api.sent("events/") for e in b["events"] if e["type"] == "checkpoint.saved"
    ]
    (saved,) = checkpoints
    assert saved["label"].startswith(CHECKPOINT_PREFIX)
    assert saved["state"]["next"] == ["c"] and saved["state"]["values"]["log"] == ["a", "b"]
    assert ("step.completed", "b#2") in events(fake_api, "step.completed")
    assert events(fake_api, "step.started")[-1] == ("step.started", "b#2")

    # A reviewer resumes: a new lease at the next epoch, the run's resume_from is the label.
    fake_api.epoch = 5
    fake_api.overrides[""] = lambda request, body: httpx.Response(
        200, json={"id": "run_1", "resume_from": saved["label"]}
    )
    with leased(client) as resumed:
        outcome = SafestopGraph(resumed, graph).invoke()
        resumed.complete(outcome.values)
    assert ran == ["a", "b", "c"]
    assert outcome.status == "completed" and outcome.values["log"] == ["a", "b", "c"]
    assert events(fake_api, "step.started")[-1] == ("step.started", "c#3")


def test_a_refused_permit_ends_the_node_before_the_tool_and_the_node_reruns_on_resume(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    tool_ran: list[str] = []

    @safestop_tool(side_effect="write")
    def send_mail(to: str) -> str:
        tool_ran.append(to)
        return "sent"

    graph = build(
        {"draft": lambda s: {"log": ["draft"]}, "send": lambda s: {"log": [send_mail("x")]}}
    )
    fake_api.overrides["permits/"] = lambda request, body: refusal("stale_epoch")
    with leased(client) as run:
        SafestopGraph(run, graph).invoke({"log": []})
    assert tool_ran == [] and run.token.reason == "stale_epoch"
    failed = [
        e for b in fake_api.sent("events/") for e in b["events"] if e["type"] == "step.failed"
    ]
    assert [(e["key"], e["cancelled"]) for e in failed] == [("send#2", True)]
    (saved,) = [
        e for b in fake_api.sent("events/") for e in b["events"] if e["type"] == "checkpoint.saved"
    ]
    assert saved["state"]["next"] == ["send"], "the interrupted node runs again on resume"


def test_a_write_in_flight_at_the_stop_is_reported_unknown(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    @safestop_tool(side_effect="write")
    def transfer(amount: int) -> str:
        token = current_token()
        token.cancel("user_stop", stop_epoch=4)  # the stop lands while the bank is working
        token.raise_if_cancelled()
        return "done"  # pragma: no cover

    graph = build({"pay": lambda s: {"log": [transfer(5)]}})
    with leased(client) as run:
        SafestopGraph(run, graph).invoke({"log": []})
    assert [state for _id, state in results(fake_api)] == ["unknown"]


# -- approvals ---------------------------------------------------------------------------


def approval_graph(ran: list[Any]) -> Any:
    def deploy_node(state: State) -> State:
        notes = lookup("B-7")  # runs once, even though the node runs again after the wait
        ran.append(("node", notes))
        try:
            done = deploy(version="1.4.2", env="prod")
        except ApprovalRejected as no:
            return {"log": [f"rejected: {no.message}"]}
        return {"log": [done]}

    return build({"prepare": lambda s: {"log": ["prepared"]}, "deploy": deploy_node})


@safestop_tool(
    side_effect="write",
    needs_approval=True,
    risk="high",
    summary=lambda args: f"Deploy {args['version']} to {args['env']}",
)
def deploy(version: str, env: str) -> str:
    DEPLOYED.append((version, env))
    return f"deployed {version} to {env}"


DEPLOYED: list[tuple[str, str]] = []


@pytest.fixture(autouse=True)
def _forget_deploys() -> None:
    DEPLOYED.clear()


def test_an_approval_wait_is_a_langgraph_interrupt_and_holds_no_thread(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"deploy"})
    ran: list[Any] = []
    graph = approval_graph(ran)
    with leased(client) as run:
        adapter = SafestopGraph(run, graph, wait_for_approvals=False)
        threads_before = threading.active_count()
        waiting = adapter.invoke({"log": []})
        assert waiting.status == "waiting_for_approval"
        assert [a["approval_id"] for a in waiting.approvals] == ["appr_1"]
        assert waiting.approvals[0]["summary"] == "Deploy 1.4.2 to prod"
        # invoke() returned while the approval waits: no thread was left behind to wait on it
        # (compared with the process's own count: the suite's other threads vary).
        assert DEPLOYED == [] and threading.active_count() <= threads_before
        snapshot = graph.get_state({"configurable": {"thread_id": "safestop-run_1"}})
        assert snapshot.next == ("deploy",) and snapshot.interrupts, "paused by interrupt()"

        assert adapter.invoke().status == "waiting_for_approval", "still undecided"
        server.decide("approved", arguments={"version": "1.4.3", "env": "prod"})
        outcome = adapter.invoke()
    assert outcome.status == "completed"
    assert DEPLOYED == [("1.4.3", "prod")], "ran once, with the reviewer's arguments"
    assert outcome.values["log"] == ["prepared", "deployed 1.4.3 to prod"]
    assert [p["tool"] for p in fake_api.sent("permits/")].count("lookup") == 1
    assert len(ran) == 2, "once to the interrupt, once after the decision (not while undecided)"
    (first, *again) = server.asked
    assert first["needs_approval"] is True and first["risk"] == "high"
    assert {p["tool_call_id"] for p in again} == {first["tool_call_id"]}, "the same call"
    started = [key for _t, key in events(fake_api, "step.started")]
    assert started == ["prepare#1", "deploy#2"], "one step, however often the node ran"


def test_invoke_waits_for_a_pushed_decision_by_default(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"deploy"})
    with leased(client) as run:

        def reviewer() -> None:
            assert wait_until(lambda: server.asked)
            server.decide("approved", arguments={"version": "1.4.2", "env": "staging"})
            run.handle_push_frame(
                {
                    "type": "approval.decided",
                    "approval_id": "appr_1",
                    "decision": "approve",
                    "arguments": {"version": "1.4.2", "env": "staging"},
                    "permit_id": "permit_9",
                }
            )

        threading.Thread(target=reviewer, daemon=True).start()
        outcome = SafestopGraph(run, approval_graph([])).invoke({"log": []})
    assert outcome.values["log"][-1] == "deployed 1.4.2 to staging"


def test_a_rejection_reaches_the_node_with_the_reviewers_message(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"deploy"})
    server.decide("rejected", message="Not on a Friday.")
    server.decision = None  # the first ask waits; the decision comes while it waits
    with leased(client) as run:
        adapter = SafestopGraph(run, approval_graph([]), wait_for_approvals=False)
        assert adapter.invoke({"log": []}).status == "waiting_for_approval"
        server.decide("rejected", message="Not on a Friday.")
        outcome = adapter.invoke()
    assert DEPLOYED == []
    assert outcome.values["log"][-1] == "rejected: Not on a Friday."


def test_a_stop_during_the_approval_wait_ends_the_graph_checkpointed(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"deploy"})
    with leased(client) as run:
        threading.Thread(
            target=lambda: wait_until(lambda: server.asked) and run.token.cancel("user_stop", 4),
            daemon=True,
        ).start()
        SafestopGraph(run, approval_graph([])).invoke({"log": []})
    assert DEPLOYED == [] and run.token.cancelled
    saved = [
        e for b in fake_api.sent("events/") for e in b["events"] if e["type"] == "checkpoint.saved"
    ]
    assert saved and saved[0]["state"]["next"] == ["deploy"]
    failed = [
        e for b in fake_api.sent("events/") for e in b["events"] if e["type"] == "step.failed"
    ]
    assert [(e["key"], e["cancelled"]) for e in failed] == [("deploy#2", True)]


def void_frame() -> dict[str, Any]:
    return {
        "type": "approval.decided",
        "approval_id": "appr_1",
        "decision": "void",
        "message": "voided by a stop",
    }


def test_a_void_pushed_before_the_stop_never_resumes_the_graph(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    """The server voids the waiting approval, then pushes the stop: the void must not be
    taken as a decision, or the node would run again after the stop."""
    server = ApprovalServer(fake_api, {"deploy"})
    ran: list[Any] = []
    with leased(client) as run:

        def stop() -> None:
            assert wait_until(lambda: server.asked)
            run.handle_push_frame(void_frame())
            threading.Event().wait(0.03)  # the stop's own frame comes a moment later
            run.handle_stop_signal({"reason": "user_stop", "stop_epoch": 4})

        threading.Thread(target=stop, daemon=True).start()
        SafestopGraph(run, approval_graph(ran)).invoke({"log": []})
    assert run.token.cancelled and DEPLOYED == []
    assert len(ran) == 1, "the node ran once, up to its wait, and never after the stop"
    assert len(server.asked) == 1, "the permit was not asked again"
    failed = fake_api.events_of_type("step.failed")
    assert [(e["key"], e["cancelled"]) for e in failed] == [("deploy#2", True)]
    assert fake_api.sent("drained/")


def test_a_void_whose_stop_signal_is_lost_ends_the_graph_by_the_runs_status(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"deploy"})
    fake_api.overrides[""] = lambda request, body: httpx.Response(
        200, json={"id": "run_1", "status": "cancel_requested"}
    )
    ran: list[Any] = []
    with leased(client) as run:
        threading.Thread(
            target=lambda: wait_until(lambda: server.asked) and run.handle_push_frame(void_frame()),
            daemon=True,
        ).start()
        SafestopGraph(run, approval_graph(ran)).invoke({"log": []})
    assert run.token.cancelled and run.token.reason == "cancel_requested"
    assert len(ran) == 1 and DEPLOYED == []


def test_the_graphs_own_interrupt_is_handed_back(client: SafestopClient, fake_api: FakeApi) -> None:
    def ask_human(state: State) -> State:
        return {"answer": interrupt("which colour?")}

    graph = build({"ask": ask_human, "done": lambda s: {"log": [f"got {s['answer']}"]}})
    with leased(client) as run:
        adapter = SafestopGraph(run, graph)
        paused = adapter.invoke({"log": []})
        assert paused.status == "interrupted" and paused.interrupts[0].value == "which colour?"
        outcome = adapter.invoke(Command(resume="blue"))
    assert outcome.values["log"] == ["got blue"]
