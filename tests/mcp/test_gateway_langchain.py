"""`langchain-mcp-adapters` in a LangGraph agent (a scripted model) through the gateway.

The adapters run in their own interpreter (`make mcp-clients`: every release so far requires
mcp<2, the repository runs the 2.x SDK), talking to the live gateway over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from runs.actors import Actor
from runs.models import Approval, ExecutionRecord, Run
from runs.services import approval_rule_create
from tests.mcp.scenarios import eventually, reviewer_post

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv-mcp-langchain/bin/python"
CLIENT = REPO / "tests/mcp/langchain_client.py"


def langchain_agent(url: str, token: str, script: list[Any]) -> subprocess.Popen[str]:
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: run `make mcp-clients`")
    return subprocess.Popen(
        [str(PYTHON), str(CLIENT), url, token, json.dumps(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(agent: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = agent.communicate(timeout=180)
    assert agent.returncode == 0, err[-3000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def test_langgraph_agent_calls_through_the_gateway_and_reads_a_rejection(
    live_stack, everything, agent_token, reviewer_token, team
) -> None:
    approval_rule_create(
        team_id=team.pk, actor=Actor.system("test"), name="sums need a person", tool_glob="get-sum"
    )
    agent = langchain_agent(
        f"{live_stack.url}/mcp/everything/",
        agent_token.raw,
        [
            [{"name": "echo", "args": {"message": "from langgraph"}}],
            [{"name": "get-sum", "args": {"a": 2, "b": 3}}],
            "done",
        ],
    )

    async def reviewer() -> None:
        approval = await eventually(
            lambda: Approval.objects.filter(status="waiting").first(), "the held sum", 120
        )
        answer = await reviewer_post(
            live_stack.url,
            reviewer_token,
            f"/api/v1/approvals/{approval.pk}/decide/",
            {"decision": "reject", "message": "sums go through finance"},
        )
        assert answer.status_code == 200, answer.text

    asyncio.run(reviewer())
    answer = finished(agent)
    assert "echo" in answer["tools"] and "get-sum" in answer["tools"]
    echo, rejected = answer["tool_messages"]
    assert (echo["name"], echo["status"]) == ("echo", "success")
    assert "Echo: from langgraph" in echo["text"]
    assert (rejected["name"], rejected["status"]) == ("get-sum", "error")
    assert "sums go through finance" in rejected["text"]  # the model read the reviewer's reason
    assert answer["final"] == "done"
    records = {r.tool: r.execution_state for r in ExecutionRecord.objects.all()}
    assert records == {"echo": "succeeded", "get-sum": "not_started"}
    run = Run.objects.get()
    assert run.title.endswith("via everything")
