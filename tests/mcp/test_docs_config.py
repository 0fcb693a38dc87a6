"""docs/agents.md's "No code" configurations, run as written: the `mcp` client as a script; the
OpenAI Agents SDK's and `langchain-mcp-adapters`' blocks with their `main` called with a scripted
model in place of a real one (the only part of each block that is not run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runs.models import ExecutionRecord, Run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "agents.md"
LANGCHAIN_PYTHON = REPO / ".venv-mcp-langchain/bin/python"  # `make mcp-clients`
HEADING = "## No code: point your MCP client at safestop"


def documented_blocks() -> list[str]:
    """The Python blocks of the "No code" section, in order: mcp, Agents SDK, LangGraph."""
    section = DOC.read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
    return [part.split("```", 1)[0] for part in section.split("```python\n")[1:]]


def run(argv: list[str], live_stack, agent_token) -> str:
    done = subprocess.run(
        argv,
        env={
            **os.environ,
            "SAFESTOP_URL": live_stack.url,
            "SAFESTOP_TOKEN": agent_token.raw,
            "OPENAI_API_KEY": "sk-dummy-never-used",
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
        },
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def with_scripted_model(block: Path, model: str) -> str:
    """Python that runs `block` as a module (its `__main__` part skipped), then its `main`."""
    return (
        "import asyncio, sys\n"
        f"sys.path[:0] = [{str(REPO)!r}, {str(REPO / 'tests/mcp')!r}]\n"
        f"namespace = {{'__name__': 'documented'}}\n"
        f"exec(open({str(block)!r}).read(), namespace)\n"
        f"{model}\n"
        "asyncio.run(namespace['main'](model))\n"
    )


def test_there_are_the_three_documented_configurations() -> None:
    mcp, agents, langchain = documented_blocks()
    assert "streamable_http_client" in mcp
    assert "MCPServerStreamableHttp" in agents
    assert "langchain_mcp_adapters" in langchain


def test_the_documented_mcp_client_configuration_works(live_stack, everything, agent_token) -> None:
    out = run([sys.executable, "-c", documented_blocks()[0]], live_stack, agent_token)
    assert "Echo: hello" in out
    assert "'echo'" in out
    assert ExecutionRecord.objects.get().tool == "echo"


def test_the_documented_agents_sdk_configuration_works(
    live_stack, everything, agent_token, tmp_path: Path
) -> None:
    block = tmp_path / "agents_block.py"
    block.write_text(documented_blocks()[1])
    model = (
        "from tests.support.scripted_model import ScriptedModel, call, say\n"
        "model = ScriptedModel([[call('echo', {'message': 'hello'}, 'c1')], [say('said hello')]])"
    )
    out = run([sys.executable, "-c", with_scripted_model(block, model)], live_stack, agent_token)
    assert "said hello" in out
    record = ExecutionRecord.objects.get()
    assert (record.tool, record.execution_state) == ("echo", "succeeded")
    assert Run.objects.count() == 1


def test_the_documented_langchain_configuration_works(
    live_stack, everything, agent_token, tmp_path: Path
) -> None:
    if not LANGCHAIN_PYTHON.exists():
        pytest.fail(f"{LANGCHAIN_PYTHON} is missing: run `make mcp-clients`")
    block = tmp_path / "langchain_block.py"
    block.write_text(documented_blocks()[2])
    model = (
        "from langchain_client import ScriptedChat\n"
        "model = ScriptedChat(turns=[[{'name': 'echo', 'args': {'message': 'hi'}}], 'said hi'],"
        " seen=[])"
    )
    out = run(
        [str(LANGCHAIN_PYTHON), "-c", with_scripted_model(block, model)], live_stack, agent_token
    )
    assert "said hi" in out
    record = ExecutionRecord.objects.get()
    assert (record.tool, record.execution_state) == ("echo", "succeeded")
    assert Run.objects.count() == 1  # one session for the agent: one run
