"""A small MCP server for the gateway's write-path tests, on the `mcp` SDK's server side
(stdio): server-everything has no write tool slow enough to stop in the middle of.

- `deploy(service, seconds)`: a write (no readOnlyHint) that sleeps, then answers;
- `crash(seconds)`: a write whose process exits mid-call (an upstream that dies);
- `status(service)`: a read.
Each call appends a line to the file named by WRITER_LOG (when set), so a test can tell
whether a call reached the server.
"""

from __future__ import annotations

import os

import anyio
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

server = MCPServer("slow-writer")


def _log(line: str) -> None:
    path = os.environ.get("WRITER_LOG")
    if path:
        with open(path, "a") as handle:
            handle.write(line + "\n")


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
async def deploy(service: str, seconds: float = 0.0) -> str:
    """Deploy a service (takes `seconds`)."""
    _log(f"deploy-start {service}")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        # The SDK interrupts a handler on the client's notifications/cancelled.
        _log(f"deploy-cancelled {service}")
        raise
    _log(f"deploy-done {service}")
    return f"deployed {service}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False))
async def crash(seconds: float = 0.2) -> str:
    """Start a write, then die."""
    _log("crash-start")
    await anyio.sleep(seconds)
    os._exit(3)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def status(service: str) -> str:
    """Read a service's status."""
    _log(f"status {service}")
    return f"{service} is up"


if __name__ == "__main__":
    _log(f"pid {os.getpid()}")
    server.run("stdio")
