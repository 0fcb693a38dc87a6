"""The demo registers server-everything as an MCP upstream when it is installed."""

from __future__ import annotations

import shutil

import pytest
from django.core.management import call_command

from console.demo.mcp import DEMO_MCP_TEAM, demo_mcp_ensure, everything_entry_point
from gateway.models import McpUpstream

pytestmark = pytest.mark.django_db


def test_demo_registers_server_everything_once() -> None:
    if not everything_entry_point().exists() or shutil.which("node") is None:
        pytest.fail("run `make mcp-servers` (server-everything from tests/mcp's lockfile)")
    call_command("demo_setup")
    call_command("demo_setup")  # idempotent
    upstream = McpUpstream.objects.get()
    assert (upstream.team.slug, upstream.name, upstream.transport) == (
        DEMO_MCP_TEAM,
        "everything",
        "stdio",
    )
    assert upstream.args[-1] == "stdio"


def test_demo_without_the_npm_package_registers_nothing(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(
        "console.demo.mcp.everything_entry_point", lambda: tmp_path / "missing/index.js"
    )
    assert demo_mcp_ensure() is None
    assert not McpUpstream.objects.exists()
