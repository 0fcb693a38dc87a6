"""The MCP gateway against MCP servers nobody here wrote (`@modelcontextprotocol/server-everything`
and `@modelcontextprotocol/server-filesystem`, installed from tests/mcp/package-lock.json by
`make mcp-servers`) and the `mcp` SDK's client."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from gateway.models import McpUpstream
from gateway.services import upstream_create
from runs.actors import Actor
from runs.models import Team

HERE = Path(__file__).resolve().parent
EVERYTHING = HERE / "node_modules/@modelcontextprotocol/server-everything/dist/index.js"
FILESYSTEM = HERE / "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
SLOW_WRITER = HERE / "slow_writer.py"
NODE = shutil.which("node") or "node"


def _require_everything() -> None:
    if not EVERYTHING.exists():
        pytest.fail(f"{EVERYTHING} is missing: run `make mcp-servers` (npm ci from the lockfile)")


@pytest.fixture
def everything(team: Team) -> McpUpstream:
    """server-everything over stdio, registered as `/mcp/everything/`."""
    _require_everything()
    return upstream_create(
        team=team,
        name="everything",
        transport="stdio",
        command=NODE,
        args=[str(EVERYTHING), "stdio"],
        env={"EVERYTHING_TOKEN": "s3cret-value"},
        actor=Actor.system("test"),
    )


@pytest.fixture
def shared_dir(tmp_path: Path) -> Path:
    """The one directory the filesystem upstream may touch."""
    folder = tmp_path / "shared"
    folder.mkdir()
    return folder


@pytest.fixture
def filesystem(team: Team, shared_dir: Path) -> McpUpstream:
    """server-filesystem over stdio, allowed `shared_dir` only, registered as `/mcp/files/`."""
    if not FILESYSTEM.exists():
        pytest.fail(f"{FILESYSTEM} is missing: run `make mcp-servers` (npm ci from the lockfile)")
    return upstream_create(
        team=team,
        name="files",
        transport="stdio",
        command=NODE,
        args=[str(FILESYSTEM), str(shared_dir)],
        actor=Actor.system("test"),
    )


@pytest.fixture
def writer_log(tmp_path: Path) -> Path:
    return tmp_path / "writer.log"


@pytest.fixture
def slow_writer(team: Team, writer_log: Path) -> McpUpstream:
    """A small MCP server on the SDK's own server side, with write tools that take their time
    and one that crashes its process mid-call (tests/mcp/slow_writer.py)."""
    return upstream_create(
        team=team,
        name="writer",
        transport="stdio",
        command=sys.executable,
        args=[str(SLOW_WRITER)],
        env={"WRITER_LOG": str(writer_log)},
        actor=Actor.system("test"),
    )


@contextlib.asynccontextmanager
async def mcp_session(
    url: str, token: str, headers: dict[str, str] | None = None, **session_kwargs: Any
) -> AsyncIterator[ClientSession]:
    """The official SDK client on the gateway: streamable HTTP, the agent token as a bearer."""
    async with httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}", **(headers or {})},
        timeout=httpx2.Timeout(30.0, read=120.0),
    ) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write, **session_kwargs) as session:
                yield session
