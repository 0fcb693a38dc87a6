"""The demo's MCP upstream: `server-everything` as `/mcp/everything/` of the platform team, so a
newcomer can point an MCP client at the console at once (docs/agents.md, "No code").

Registered only when `make mcp-servers` installed it (tests/mcp/node_modules) and `node` runs:
the demo never fetches anything.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django.conf import settings

from gateway.models import McpUpstream
from gateway.services import upstream_create
from runs.actors import Actor
from runs.tokens import team_ensure

DEMO_MCP_TEAM = "platform"
DEMO_MCP_NAME = "everything"


def everything_entry_point() -> Path:
    return (
        Path(settings.BASE_DIR)
        / "tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
    )


def demo_mcp_ensure() -> McpUpstream | None:
    """Register server-everything for the demo team once; None when it is not installed."""
    entry = everything_entry_point()
    node = shutil.which("node")
    if node is None or not entry.exists():
        return None
    team = team_ensure(slug=DEMO_MCP_TEAM)
    existing = McpUpstream.objects.filter(team=team, name=DEMO_MCP_NAME).first()
    if existing is not None:
        return existing
    return upstream_create(
        team=team,
        name=DEMO_MCP_NAME,
        transport="stdio",
        command=node,
        args=[str(entry), "stdio"],
        actor=Actor.system("demo-setup"),
    )
