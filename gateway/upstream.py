"""One upstream MCP server connection per gateway session, on the `mcp` SDK's client side.

The connection lives in a task of its own (`UpstreamLink.run`): the SDK's transports are
anyio context managers that must be entered and left by one task, while calls come from the
request handlers' tasks. A stdio upstream is the SDK's `stdio_client`: the command runs in a
new session (its own process group), and leaving the context closes its stdin, then
SIGTERMs and SIGKILLs the whole group — so `close()` kills the upstream with its tree.

Cancelling a task that awaits `call_tool` makes the SDK send `notifications/cancelled` for
that request upstream (its "courtesy cancel"): that is how a stop reaches the upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from typing import Any

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter

from gateway.models import Transport

logger = logging.getLogger(__name__)

RAW_RESULT = TypeAdapter(dict[str, Any])
GATEWAY_INFO = types.Implementation(name="safestop-mcp-gateway", version="1.0")


class UpstreamUnavailable(Exception):
    """The upstream could not be started or reached, or it has exited."""


class UpstreamLink:
    def __init__(
        self,
        *,
        transport: str,
        command: str = "",
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        url: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.transport = transport
        self.command = command
        self.args = list(args or [])
        self.env = dict(env or {})
        self.url = url
        self.headers = dict(headers or {})
        self.session: ClientSession | None = None
        self.initialize_result: types.InitializeResult | None = None
        self.error: str = ""
        self._ready = asyncio.Event()
        self._close = asyncio.Event()
        self.closed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> types.InitializeResult:
        self._task = asyncio.create_task(self.run(), name="mcp-upstream")
        await self._ready.wait()
        if self.initialize_result is None:
            raise UpstreamUnavailable(self.error or "the upstream did not initialize")
        return self.initialize_result

    async def run(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.transport == Transport.STDIO:
                    params = StdioServerParameters(
                        command=self.command, args=self.args, env=self.env or None
                    )
                    read, write = await stack.enter_async_context(
                        stdio_client(params, errlog=sys.stderr)
                    )
                else:
                    client = await stack.enter_async_context(
                        httpx2.AsyncClient(headers=self.headers, follow_redirects=False)
                    )
                    read, write = await stack.enter_async_context(
                        streamable_http_client(self.url, http_client=client)
                    )
                session = await stack.enter_async_context(
                    ClientSession(read, write, client_info=GATEWAY_INFO)
                )
                self.initialize_result = await session.initialize()
                self.session = session
                self._ready.set()
                await self._close.wait()
        except Exception as error:  # the upstream failed to start, or died: tell the callers
            logger.warning("MCP upstream %s ended: %r", self.command or self.url, error)
            self.error = self.error or f"{type(error).__name__}: {error}"[:500]
        finally:
            self.session = None
            self._ready.set()
            self.closed.set()

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.closed.is_set()

    def _session(self) -> ClientSession:
        if self.session is None:
            raise UpstreamUnavailable(self.error or "the upstream has exited")
        return self.session

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None, progress: Any = None
    ) -> dict[str, Any]:
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=name, arguments=arguments)
        )
        return await self._send(request, progress)

    async def request(self, request: Any) -> dict[str, Any]:
        return await self._send(request, None)

    async def _send(self, request: Any, progress: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await self._session().send_request(
                request,
                RAW_RESULT,  # type: ignore[type-var]  # any JSON object: passed on unchanged
                progress_callback=progress,
            )
            return result
        except MCPError as error:
            if error.code == types.CONNECTION_CLOSED:
                # The upstream went away (a stdio server that exited, a closed HTTP
                # connection): leave the transport, so `closed` tells the session.
                self.error = self.error or "the upstream closed the connection"
                self._close.set()
            raise

    async def close(self) -> None:
        """Leave the transport: for stdio, the SDK kills the process group (bounded waits)."""
        self._close.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._task
