"""docs/agents.md's "No code" configuration for the `mcp` client, run as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runs.models import ExecutionRecord

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def documented_client() -> str:
    text = DOC.read_text()
    section = text.split("## No code: point your MCP client at safestop", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_mcp_client_configuration_works(live_stack, everything, agent_token) -> None:
    done = subprocess.run(
        [sys.executable, "-c", documented_client()],
        env={**os.environ, "SAFESTOP_URL": live_stack.url, "SAFESTOP_TOKEN": agent_token.raw},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Echo: hello" in done.stdout
    assert "'echo'" in done.stdout
    assert ExecutionRecord.objects.get().tool == "echo"
