"""`approval_flow="interrupt"` without holding a process: the worker suspends the run at the
SDK's interruptions and returns; another process (here another client and lease) goes on
from the saved `RunState` once the reviewer has decided, and the approved tool runs once.

Scripted models (no network), the scripted `FakeApi`/`PermitLedger` as the server; the same
flow against the real server, in real processes, is tests/agent_e2e/test_suspend_live.py.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import pytest
from agent_fakes import FakeApi, PermitLedger
from agents import Agent, function_tool, set_tracing_disabled

from safestop_agent import AgentRun, Cancelled, SafestopClient
from safestop_agent.integrations.openai_agents import (
    SuspendedRun,
    guard_agent,
    resume_when_decided,
    run_agent_sync,
    suspend_for_approvals,
)
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


def support(*turns: list[Any]) -> Agent[Any]:
    agent = Agent(name="support", tools=[refund], model=ScriptedModel(list(turns)))
    return guard_agent(agent, writes={"refund"}, approval_flow="interrupt")


def asks_refund() -> list[Any]:
    return [call("refund", {"order": "A-1", "amount": 120}, "call_r")]


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, approval_poll_interval=60.0)


def run_status(api: FakeApi, status: str) -> None:
    api.overrides[""] = lambda request, body: httpx.Response(
        200, json={"id": "run_1", "status": status, "stop_epoch": api.epoch}
    )


def releases(api: FakeApi) -> list[dict[str, Any]]:
    return api.sent("lease/release/")


def test_the_worker_returns_while_waiting_and_another_process_runs_the_approved_tool_once(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    ledger = PermitLedger(fake_api, held={"refund"})
    with leased(client) as run:
        result = run_agent_sync(run, support(asks_refund()), "Refund A-1")
        outcome = asyncio.run(suspend_for_approvals(run, support(), result))
        assert isinstance(outcome, SuspendedRun)
        saved = outcome.to_string()
    # The lease went back once, suspended; leaving the block sent nothing more.
    assert releases(fake_api) == [
        {"lease_id": "lease_tok", "epoch": 3, "suspend": True, "reason": "waiting_for_approval"}
    ]
    assert fake_api.sent("drained/") == [] and DONE == []
    (approval,) = ledger.waiting()
    assert outcome.approvals == (approval["id"],)

    # Another process: a client of its own, the agent built again, the saved text.
    second = SafestopClient(
        "http://127.0.0.1:9", "secret-token", transport=httpx.MockTransport(fake_api.handle)
    )
    run_status(fake_api, "suspended")
    ledger.decide(approval["id"], "approved", arguments={"order": "A-1", "amount": 90})

    async def go_on() -> Any:
        agent = support([say("Refunded 90.")])
        async with resume_when_decided(
            second,
            agent,
            saved,
            worker_id="worker-2",
            poll_interval=0.01,
            lease_options={"push": False},
        ) as (run, resumed):
            assert run.worker_id == "worker-2"
            run.complete({"answer": resumed.final_output})
            return resumed

    resumed = asyncio.run(go_on())
    second.disconnect()
    assert resumed.final_output == "Refunded 90."
    assert DONE == [("refund", ("A-1", 90))], "the approved tool ran once, with the edit"
    reported = [
        (p.split("/")[1], b["execution_state"]) for p, b in fake_api.sent_matching("tool-calls/")
    ]
    assert reported == [("call_r.e3", "succeeded")]
    assert ledger.conflicts() == {}


def test_it_waits_holding_nothing_until_the_reviewer_decides(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    ledger = PermitLedger(fake_api, held={"refund"})
    with leased(client) as run:
        result = run_agent_sync(run, support(asks_refund()), "Refund A-1")
        saved = asyncio.run(suspend_for_approvals(run, support(), result))
    assert isinstance(saved, SuspendedRun)
    run_status(fake_api, "suspended")
    leases_before = len(fake_api.sent("lease/"))
    (approval,) = ledger.waiting()

    async def go_on() -> None:
        waiter = asyncio.ensure_future(_resume(client, saved))
        for _ in range(50):  # polls, holding no lease, while the approval waits
            await asyncio.sleep(0.01)
        assert not waiter.done() and len(fake_api.sent("lease/")) == leases_before
        ledger.decide(approval["id"], "rejected", message="not this one")
        await waiter

    asyncio.run(go_on())
    assert DONE == [], "rejected: the tool never ran"
    assert len(fake_api.sent("lease/")) == leases_before + 1


async def _resume(client: SafestopClient, saved: SuspendedRun) -> None:
    agent = support([say("Not refunded.")])
    async with resume_when_decided(
        client,
        agent,
        saved,
        worker_id="worker-2",
        poll_interval=0.01,
        lease_options={"push": False},
    ) as (run, resumed):
        run.complete({"answer": resumed.final_output})


def test_a_decision_already_in_goes_on_in_this_process(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    ledger = PermitLedger(fake_api, held={"refund"})
    agent = support(asks_refund(), [say("Done.")])
    with leased(client) as run:
        result = run_agent_sync(run, agent, "Refund A-1")
        (approval,) = ledger.waiting()
        ledger.decide(approval["id"], "approved")
        outcome = asyncio.run(suspend_for_approvals(run, agent, result))
        assert not isinstance(outcome, SuspendedRun) and outcome.final_output == "Done."
    assert DONE == [("refund", ("A-1", 120))]
    assert all("suspend" not in body for body in releases(fake_api)), "never suspended"


def test_a_stop_while_suspended_ends_it_and_nothing_is_leased(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    PermitLedger(fake_api, held={"refund"})
    with leased(client) as run:
        result = run_agent_sync(run, support(asks_refund()), "Refund A-1")
        saved = asyncio.run(suspend_for_approvals(run, support(), result))
    assert isinstance(saved, SuspendedRun)
    run_status(fake_api, "stopped_cleanly")
    leases_before = len(fake_api.sent("lease/"))
    with pytest.raises(Cancelled):
        asyncio.run(_resume(client, saved))
    assert len(fake_api.sent("lease/")) == leases_before and DONE == []
