"""`safestop_agent.integrations.openai_agents` with the real `openai-agents` package, on fakes.

The model is `ScriptedModel` (tests/support/scripted_model.py), an implementation of the SDK's `Model` interface that plays a
script of turns (no network, tracing off); the server is the scripted `FakeApi`. The live
version is tests/agent_e2e/test_integrations_live.py.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import httpx
import pytest
from agent_fakes import ApprovalServer, FakeApi, PermitLedger
from agents import Agent, function_tool, set_tracing_disabled
from agents.models.interface import Model

from safestop_agent import AgentRun, Cancelled, SafestopClient
from safestop_agent.integrations.openai_agents import (
    guard_agent,
    resume_agent,
    run_agent,
    run_agent_streamed,
    run_agent_sync,
    stream_events,
)
from tests.support.scripted_model import ScriptedModel, call, say
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)
os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-never-used")
set_tracing_disabled(True)


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


DONE: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def _forget() -> None:
    DONE.clear()


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    DONE.append(("lookup", order))
    return f"order {order}: 120 EUR, delivered"


@function_tool(needs_approval=True)
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    DONE.append(("refund", (order, amount)))
    return f"refunded {amount} EUR on {order}"


def support_agent(model: Model) -> Agent[Any]:
    agent = Agent(name="support", instructions="Help.", tools=[lookup_order, refund], model=model)
    return guard_agent(agent, writes={"refund"}, risk={"refund": "high"})


def results(api: FakeApi) -> list[tuple[str, str]]:
    return [
        (path.split("/")[1], body["execution_state"])
        for path, body in api.sent_matching("tool-calls/")
    ]


def step_events(api: FakeApi) -> list[tuple[str, str]]:
    return [
        (e["type"], e["key"])
        for batch in api.sent("events/")
        for e in batch["events"]
        if e["type"].startswith("step.")
    ]


def test_each_tool_call_asks_a_permit_and_reports_its_result(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    model = ScriptedModel(
        [
            [call("lookup_order", '{"order": "A-1"}', "call_1")],
            [say("Order A-1 was delivered.")],
        ]
    )
    with leased(client) as run:
        result = run_agent_sync(run, support_agent(model), "Where is A-1?")
        run.complete({"answer": result.final_output})
    assert result.final_output == "Order A-1 was delivered."
    (permit,) = fake_api.sent("permits/")
    assert (permit["tool"], permit["tool_call_id"], permit["arguments"]) == (
        "lookup_order",
        "call_1.e3",
        {"order": "A-1"},
    )
    assert permit["side_effect"] == "none" and permit["step_key"] == "lookup_order#1"
    assert results(fake_api) == [("call_1.e3", "succeeded")]
    assert step_events(fake_api) == [
        ("step.started", "model#1"),
        ("step.completed", "model#1"),
        ("step.started", "lookup_order#1"),
        ("step.completed", "lookup_order#1"),
        ("step.started", "model#2"),
        ("step.completed", "model#2"),
    ]


def test_an_approved_call_runs_with_the_reviewers_arguments(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"refund"})
    model = ScriptedModel(
        [[call("refund", '{"order": "A-1", "amount": 120}', "call_r")], [say("Refunded.")]]
    )
    with leased(client) as run:

        def reviewer() -> None:
            assert wait_until(lambda: server.asked)
            server.decide("approved", arguments={"order": "A-1", "amount": 90})
            run.handle_push_frame(
                {
                    "type": "approval.decided",
                    "approval_id": "appr_1",
                    "decision": "approve",
                    "arguments": {"order": "A-1", "amount": 90},
                    "permit_id": "permit_9",
                }
            )

        threading.Thread(target=reviewer, daemon=True).start()
        result = run_agent_sync(run, support_agent(model), "Refund A-1")
    assert DONE == [("refund", ("A-1", 90))]
    assert model.tool_outputs() == ["refunded 90 EUR on A-1"]
    assert result.final_output == "Refunded."
    (asked,) = server.asked
    assert asked["needs_approval"] is True and asked["risk"] == "high"
    assert asked["side_effect"] == "write" and asked["recovery_policy"] == "manual_confirmation"
    assert results(fake_api) == [("call_r.e3", "succeeded")]


def test_a_rejection_goes_back_to_the_model_as_the_tool_output(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"refund"})
    model = ScriptedModel(
        [
            [call("refund", '{"order": "A-1", "amount": 120}', "call_r")],
            [say("I could not refund it: the reviewer said no.")],
        ]
    )
    with leased(client) as run:

        def reviewer() -> None:
            assert wait_until(lambda: server.asked)
            server.decide("rejected", message="Over the 100 EUR limit.")
            run.handle_push_frame(
                {
                    "type": "approval.decided",
                    "approval_id": "appr_1",
                    "decision": "reject",
                    "message": "Over the 100 EUR limit.",
                }
            )

        threading.Thread(target=reviewer, daemon=True).start()
        result = run_agent_sync(run, support_agent(model), "Refund A-1")
    assert DONE == []
    (output,) = model.tool_outputs()
    assert "rejected" in output and "Over the 100 EUR limit." in output
    assert result.final_output.startswith("I could not refund it")
    assert not run.token.cancelled and results(fake_api) == []


def test_a_stop_during_a_write_cancels_the_run_and_reports_unknown(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    entered = threading.Event()

    @function_tool
    def transfer(amount: int) -> str:
        """Move money."""
        entered.set()
        threading.Event().wait(1.0)  # the bank takes its time; the stop lands meanwhile
        return "moved"

    model = ScriptedModel([[call("transfer", '{"amount": 5}', "call_t")], [say("never asked for")]])
    agent = guard_agent(Agent(name="bank", tools=[transfer], model=model), writes={"transfer"})
    with leased(client) as run:
        threading.Thread(
            target=lambda: entered.wait(10) and run.token.cancel("user_stop", 4), daemon=True
        ).start()
        with pytest.raises(Cancelled):
            run_agent_sync(run, agent, "Move 5")
        raise Cancelled("user_stop")  # the lease block drains, as it would have
    assert results(fake_api) == [("call_t.e3", "unknown")]
    assert len(model.inputs) == 1, "no model call after the stop"
    assert fake_api.sent("drained/")


def test_a_stop_while_the_model_thinks_starts_no_tool(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    model = ScriptedModel([[call("lookup_order", '{"order": "A-1"}', "call_1")]], hold={1: 5.0})

    async def main(run: AgentRun) -> None:
        asyncio.get_running_loop().call_later(0.2, run.token.cancel, "user_stop", 4)
        await run_agent(run, support_agent(model), "Where is A-1?")

    with leased(client) as run:
        with pytest.raises(Cancelled):
            asyncio.run(main(run))
    assert fake_api.sent("permits/") == [] and DONE == []
    failed = [e for e in step_events(fake_api) if e[0] == "step.failed"]
    assert failed == [("step.failed", "model#1")]


def test_a_stop_cancels_a_streamed_run(client: SafestopClient, fake_api: FakeApi) -> None:
    model = ScriptedModel(
        [
            [call("lookup_order", '{"order": "A-1"}', "call_1")],
            [call("lookup_order", '{"order": "A-2"}', "call_2")],
            [say("done")],
        ],
        hold={2: 5.0},
    )
    seen: list[str] = []

    async def main(run: AgentRun) -> None:
        result = run_agent_streamed(run, support_agent(model), "Look up A-1 and A-2")
        async for event in stream_events(run, result):
            seen.append(event.type)
            if event.type == "run_item_stream_event" and event.name == "tool_output":
                run.token.cancel("user_stop", 4)  # the reviewer presses Stop mid-stream

    with leased(client) as run:
        with pytest.raises(Cancelled):
            asyncio.run(main(run))
    assert DONE == [("lookup", "A-1")], "the second lookup never started"
    assert [p["tool_call_id"] for p in fake_api.sent("permits/")] == ["call_1.e3"]
    assert "run_item_stream_event" in seen


def test_a_stop_during_an_approval_wait_never_runs_the_tool(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"refund"})
    model = ScriptedModel([[call("refund", '{"order": "A-1", "amount": 1}', "call_r")]])
    with leased(client) as run:
        threading.Thread(
            target=lambda: wait_until(lambda: server.asked) and run.token.cancel("user_stop", 4),
            daemon=True,
        ).start()
        with pytest.raises(Cancelled):
            run_agent_sync(run, support_agent(model), "Refund A-1")
    assert DONE == []
    assert results(fake_api) == [("call_r.e3", "not_started")]


def test_a_void_caused_by_a_stop_ends_the_run_not_the_tool_call(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    """A void heard before (or instead of) the stop signal is a stop, not a rejection the
    model would read and act on."""
    server = ApprovalServer(fake_api, {"refund"})
    fake_api.overrides[""] = lambda request, body: httpx.Response(
        200, json={"id": "run_1", "status": "cancel_requested"}
    )
    model = ScriptedModel(
        [[call("refund", '{"order": "A-1", "amount": 1}', "call_r")], [say("never asked")]]
    )
    void = {"type": "approval.decided", "approval_id": "appr_1", "decision": "void"}
    with leased(client) as run:
        threading.Thread(
            target=lambda: wait_until(lambda: server.asked) and run.handle_push_frame(void),
            daemon=True,
        ).start()
        with pytest.raises(Cancelled):
            run_agent_sync(run, support_agent(model), "Refund A-1")
    assert DONE == [] and len(model.inputs) == 1, "the model never read a 'void' as an answer"


def test_tool_results_are_reported_off_the_event_loop(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    """The report is a blocking HTTP call (retried): on the loop it would freeze every other
    task of the agent, a stop's cancellation included."""
    loop_thread: list[threading.Thread] = []

    @function_tool
    async def ping() -> str:
        """Ping."""
        loop_thread.append(threading.current_thread())
        return "pong"

    model = ScriptedModel([[call("ping", "{}", "call_p")], [say("ok")]])
    with leased(client) as run:
        reported_in: list[threading.Thread] = []
        report = run.report_outcome

        def spy(call: Any, error: Any) -> None:
            reported_in.append(threading.current_thread())
            report(call, error)

        run.report_outcome = spy  # type: ignore[method-assign]
        run_agent_sync(run, guard_agent(Agent(name="a", tools=[ping], model=model)), "ping")
    assert results(fake_api) == [("call_p.e3", "succeeded")]
    assert len(reported_in) == 1 and reported_in[0] is not loop_thread[0]


@pytest.mark.parametrize("decision", ["approved", "rejected"])
def test_the_sdks_own_interruptions_resume_with_the_reviewers_decision(
    client: SafestopClient, fake_api: FakeApi, decision: str
) -> None:
    """`approval_flow="interrupt"`: the run returns at the SDK's interruption (no task or
    thread waits for the reviewer); its saved `RunState` goes on with the decision."""
    ledger = PermitLedger(fake_api, held={"refund"})
    model = ScriptedModel(
        [[call("refund", {"order": "A-1", "amount": 120}, "call_r")], [say("Done.")]]
    )
    agent = guard_agent(
        Agent(name="support", tools=[lookup_order, refund], model=model),
        writes={"refund"},
        approval_flow="interrupt",
    )
    with leased(client) as run:
        result = run_agent_sync(run, agent, "Refund A-1")
        assert [item.tool_name for item in result.interruptions] == ["refund"]
        assert DONE == [] and len(model.inputs) == 1
        saved = result.to_state().to_string()  # what a worker keeps while the reviewer decides
        (approval,) = ledger.waiting()
        assert approval["tool_call_id"] == "call_r.e3"
        ledger.decide(approval["id"], decision, arguments={"order": "A-1", "amount": 90})
        resumed = asyncio.run(resume_agent(run, agent, saved))
    assert resumed.final_output == "Done."
    if decision == "approved":
        assert DONE == [("refund", ("A-1", 90))]
        assert results(fake_api) == [("call_r.e3", "succeeded")]
    else:
        assert DONE == [] and results(fake_api) == []
    assert ledger.conflicts() == {}
