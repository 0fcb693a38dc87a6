"""Helpers for the gateway's live scenarios: an async test body run next to a live server,
database reads in the test's own thread, reviewer actions over the HTTP API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from gateway.models import McpSession

T = TypeVar("T")

# A client of the gateway over raw HTTP (no SDK): what it accepts, and the request that opens a
# session.
ACCEPT = {"Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-http", "version": "0"},
    },
}


def headers(token: Any, session_id: str = "") -> dict[str, str]:
    """A raw-HTTP request's headers: the token's bearer, and the session's id once it has one."""
    out = {**ACCEPT, "Authorization": f"Bearer {token.raw}"}
    if session_id:
        out["Mcp-Session-Id"] = session_id
    return out


async def db(fn: Callable[[], T]) -> T:
    """A database read from async test code: in a worker thread whose connection is closed
    afterwards (an open one would hold the test database past the test)."""
    from django.db import connection

    def read() -> T:
        try:
            return fn()
        finally:
            connection.close()

    return await asyncio.to_thread(read)


async def eventually(fn: Callable[[], T], what: str, timeout: float = 20.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await db(fn)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def session_run_id() -> str:
    mcp = await eventually(lambda: McpSession.objects.order_by("-id").first(), "the MCP session")
    return mcp.run_id


async def reviewer_post(base: str, token: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {token.raw}"}
    ) as client:
        return await client.post(path, json=body, timeout=30)
