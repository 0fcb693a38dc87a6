"""A worker process for tests/agent_e2e/test_suspend_live.py: an OpenAI Agents SDK agent whose
refund waits for a reviewer through the SDK's own interruptions, without holding a process.

    python -m tests.support.suspending_worker start  RUN_ID SAVED_FILE TOOL_LOG
    python -m tests.support.suspending_worker resume RUN_ID SAVED_FILE TOOL_LOG

`start` runs the agent until the refund waits, suspends the run, writes the saved state to
SAVED_FILE and exits. `resume` waits (holding nothing) until the reviewer has decided, then
leases the run and goes on from the saved state. The refund appends a line to TOOL_LOG each
time its body runs. The model is scripted (no network); the server is SAFESTOP_URL.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from agents import Agent, function_tool, set_tracing_disabled

from safestop_agent import SafestopClient
from safestop_agent.integrations.openai_agents import (
    SuspendedRun,
    guard_agent,
    resume_when_decided,
    run_agent,
    suspend_for_approvals,
)
from tests.support.scripted_model import ScriptedModel, call, say


def build(turns: list[list[Any]], tool_log: Path) -> Agent[Any]:
    @function_tool
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        with tool_log.open("a") as log:
            log.write(f"refund {order} {amount}\n")
        return f"refunded {amount} EUR on {order}"

    agent = Agent(name="support", tools=[refund], model=ScriptedModel(turns))
    return guard_agent(agent, writes={"refund"}, approvals={"refund"}, approval_flow="interrupt")


async def start(client: SafestopClient, run_id: str, saved: Path, tool_log: Path) -> None:
    agent = build([[call("refund", {"order": "1042", "amount": 120}, "call_r")]], tool_log)
    with client.lease(run_id, "worker-start") as run:
        result = await run_agent(run, agent, "Refund 1042")
        outcome = await suspend_for_approvals(run, agent, result)
        assert isinstance(outcome, SuspendedRun), outcome
        saved.write_text(outcome.to_string())
    print("suspended", flush=True)


async def resume(client: SafestopClient, saved: Path, tool_log: Path) -> None:
    agent = build([[say("Refunded.")]], tool_log)
    async with resume_when_decided(
        client, agent, saved.read_text(), worker_id="worker-resume", poll_interval=0.2
    ) as (run, outcome):
        assert not isinstance(outcome, SuspendedRun)
        run.complete({"answer": outcome.final_output})
    print("completed", flush=True)


def main() -> None:
    phase, run_id, saved, tool_log = sys.argv[1:5]
    set_tracing_disabled(True)
    os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-never-used")
    client = SafestopClient(os.environ["SAFESTOP_URL"], os.environ["SAFESTOP_TOKEN"])
    try:
        if phase == "start":
            asyncio.run(start(client, run_id, Path(saved), Path(tool_log)))
        else:
            asyncio.run(resume(client, Path(saved), Path(tool_log)))
    finally:
        client.disconnect()


if __name__ == "__main__":
    main()
