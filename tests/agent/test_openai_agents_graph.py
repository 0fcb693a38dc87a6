"""`guard_agent` guards the whole agent graph: handoff targets and agents used as tools.

Scripted models (no network), the scripted `FakeApi` as the server.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from agent_fakes import FakeApi
from agents import Agent, function_tool, handoff, set_tracing_disabled

from safestop_agent import AgentRun, SafestopClient
from safestop_agent.integrations import offline
from safestop_agent.integrations.openai_agents import guard_agent, run_agent_sync
from tests.support.scripted_model import ScriptedModel, call, say

pytestmark = pytest.mark.timeout(60)
os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-never-used")
set_tracing_disabled(True)

DONE: list[tuple[str, Any]] = []


@pytest.fixture(autouse=True)
def _forget() -> None:
    DONE.clear()


@function_tool
def refund(order: str, amount: int) -> str:
    """Refund an order."""
    DONE.append(("refund", (order, amount)))
    return f"refunded {amount} EUR on {order}"


@function_tool
def lookup_order(order: str) -> str:
    """Look an order up."""
    DONE.append(("lookup", order))
    return f"order {order}: 120 EUR"


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


def permits(api: FakeApi) -> list[tuple[str, str]]:
    return [(p["tool"], p["side_effect"]) for p in api.sent("permits/")]


def refunds_model() -> ScriptedModel:
    return ScriptedModel(
        [[call("refund", {"order": "A-1", "amount": 30}, "call_refund")], [say("Refunded.")]]
    )


@pytest.mark.parametrize("as_handoff_object", [False, True], ids=["agent", "handoff"])
def test_a_handoff_targets_tools_ask_permits(
    client: SafestopClient, fake_api: FakeApi, as_handoff_object: bool
) -> None:
    billing = Agent(name="billing", tools=[refund], model=refunds_model())
    target = handoff(billing) if as_handoff_object else billing
    triage_model = ScriptedModel([[call(handoff(billing).tool_name, {}, "call_handoff")]])
    triage = Agent(name="triage", handoffs=[target], model=triage_model)
    guarded = guard_agent(triage, writes={"refund"}, risk={"refund": "high"})
    with leased(client) as run:
        result = run_agent_sync(run, guarded, "Refund A-1")
    assert result.final_output == "Refunded."
    assert DONE == [("refund", ("A-1", 30))]
    (asked,) = fake_api.sent("permits/")
    assert (asked["tool"], asked["side_effect"], asked["risk"]) == ("refund", "write", "high")
    assert asked["tool_call_id"] == "call_refund.e3"
    assert billing.tools == [refund] and triage.handoffs == [target], "the originals unchanged"


def test_an_agent_used_as_a_tool_has_its_tools_guarded(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    billing = Agent(name="billing", tools=[refund], model=refunds_model())
    manager_model = ScriptedModel(
        [[call("billing", {"input": "refund A-1"}, "call_billing")], [say("Billing refunded it.")]]
    )
    manager = Agent(
        name="manager",
        tools=[lookup_order, billing.as_tool(tool_name="billing", tool_description="Billing")],
        model=manager_model,
    )
    with leased(client) as run:
        result = run_agent_sync(run, guard_agent(manager, writes={"refund"}), "Refund A-1")
    assert result.final_output == "Billing refunded it."
    assert permits(fake_api) == [("billing", "none"), ("refund", "write")]
    assert DONE == [("refund", ("A-1", 30))]


def test_agents_that_hand_off_to_each_other_are_guarded_once(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    support = Agent(name="support", tools=[lookup_order])
    billing = Agent(name="billing", tools=[refund], handoffs=[support])
    support.handoffs = [billing]
    guarded = guard_agent(support, writes={"refund"}, approvals={"refund"})
    (guarded_billing,) = guarded.handoffs
    assert guarded_billing.handoffs == [guarded], "the cycle closes on the copies"


def test_names_that_match_no_tool_are_refused() -> None:
    billing = Agent(name="billing", tools=[refund])
    triage = Agent(name="triage", tools=[lookup_order], handoffs=[billing])
    with pytest.raises(ValueError, match=r"no function tool named \['refnud'\]"):
        guard_agent(triage, writes={"refnud"})
    with pytest.raises(ValueError, match=r"\['send_email'\]"):
        guard_agent(triage, approvals={"send_email", "refund"})
    guard_agent(triage, writes={"refund"}, approvals={"refund"})  # on a handoff target: known


def test_guarded_tools_run_outside_a_run_only_in_offline_mode() -> None:
    model = ScriptedModel([[call("lookup_order", {"order": "A-9"}, "c1")], [say("ok")]])
    agent = guard_agent(Agent(name="support", tools=[lookup_order], model=model))
    from agents import Runner

    with offline():
        result = Runner.run_sync(agent, "Where is A-9?")
    assert result.final_output == "ok" and DONE == [("lookup", "A-9")]

    model = ScriptedModel([[call("lookup_order", {"order": "A-9"}, "c1")], [say("ok")]])
    agent = guard_agent(Agent(name="support", tools=[lookup_order], model=model))
    with pytest.raises(Exception, match="no safestop run.*offline"):  # the SDK wraps it
        Runner.run_sync(agent, "Where is A-9?")
    assert DONE == [("lookup", "A-9")], "never run unguarded outside offline()"
