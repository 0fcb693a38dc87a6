"""The OpenAI Agents SDK's own MCP support (`MCPServerStreamableHttp`) through the gateway, with
a scripted model: the model's tool calls become the run's, and a rejection reaches the model."""

from __future__ import annotations

import asyncio
import os

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp

from runs.actors import Actor
from runs.models import Approval, ExecutionRecord
from runs.services import approval_rule_create
from tests.mcp.scenarios import eventually, reviewer_post
from tests.support.scripted_model import ScriptedModel, call, say

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

os.environ.setdefault("OPENAI_API_KEY", "sk-dummy-never-used")
set_tracing_disabled(True)


def gateway(url: str, token: str) -> MCPServerStreamableHttp:
    return MCPServerStreamableHttp(
        params={"url": url, "headers": {"Authorization": f"Bearer {token}"}, "timeout": 30},
        client_session_timeout_seconds=120,
        name="safestop",
    )


def test_agents_sdk_calls_through_the_gateway_and_hears_a_rejection(
    live_stack, everything, agent_token, reviewer_token, team
) -> None:
    approval_rule_create(
        team_id=team.pk, actor=Actor.system("test"), name="sums need a person", tool_glob="get-sum"
    )
    model = ScriptedModel(
        [
            [call("echo", {"message": "from the agents sdk"}, "call_echo")],
            [call("get-sum", {"a": 1, "b": 2}, "call_sum")],
            [say("done")],
        ]
    )

    async def reviewer() -> None:
        approval = await eventually(
            lambda: Approval.objects.filter(status="waiting").first(), "the held sum"
        )
        answer = await reviewer_post(
            live_stack.url,
            reviewer_token,
            f"/api/v1/approvals/{approval.pk}/decide/",
            {"decision": "reject", "message": "use a calculator you trust"},
        )
        assert answer.status_code == 200, answer.text

    async def scenario() -> str:
        async with gateway(f"{live_stack.url}/mcp/everything/", agent_token.raw) as server:
            agent = Agent(name="mcp-agent", model=model, mcp_servers=[server])
            decide = asyncio.create_task(reviewer())
            result = await Runner.run(agent, "echo, then add")
            await decide
            return str(result.final_output)

    assert asyncio.run(scenario()) == "done"
    echo_output, sum_output = (str(output) for output in model.tool_outputs())
    assert "Echo: from the agents sdk" in echo_output
    assert "use a calculator you trust" in sum_output  # the model read the reviewer's reason
    records = {r.tool: r.execution_state for r in ExecutionRecord.objects.all()}
    assert records == {"echo": "succeeded", "get-sum": "not_started"}
