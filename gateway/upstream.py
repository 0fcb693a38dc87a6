"""One upstream MCP server connection per gateway session, on the `mcp` SDK's client side.

The connection lives in a task of its own (`UpstreamLink.run`): the SDK's transports are
anyio context managers that must be entered and left by one task, while calls come from the
request handlers' tasks. A stdio upstream is the SDK's `stdio_client`: the command runs in a
new session (its own process group), and leaving the context closes its stdin, then
SIGTERMs and SIGKILLs the whole group — so `close()` kills the upstream with its tree.

Cancelling a task that awaits `call_tool` makes the SDK send `notifications/cancelled` for
that request upstream (its "courtesy cancel"): that is how a stop reaches the upstream.

Requests the upstream sends the other way (`sampling/createMessage`, `elicitation/create`) go
to `ask_client`, which forwards them to the agent's client; the gateway declares those
capabilities upstream only when the agent's client declared them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter, ValidationError

from gateway.models import Transport

logger = logging.getLogger(__name__)

RAW_RESULT = TypeAdapter(dict[str, Any])
GATEWAY_INFO = types.Implementation(name="safestop-mcp-gateway", version="1.0")


class UpstreamUnavailable(Exception):
    """The upstream could not be started or reached, or it has exited."""


# Forwards one request from the upstream to the agent's client: (method, params) → its result.
AskClient = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class ClientRefused(Exception):
    """The agent's client answered an upstream's request with a JSON-RPC error (or could not
    be asked): the upstream gets that error."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
        client_capabilities: types.ClientCapabilities | None = None,
        ask_client: AskClient | None = None,
    ) -> None:
        self.client_capabilities = client_capabilities or types.ClientCapabilities()
        self.ask_client = ask_client
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
                    ClientSession(read, write, client_info=GATEWAY_INFO, **self._callbacks())
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

    def _callbacks(self) -> dict[str, Any]:
        """The SDK callbacks for the upstream's requests the agent's client can answer: given
        only for what the client declared, so the upstream sees the client's capabilities."""
        callbacks: dict[str, Any] = {}
        declared = self.client_capabilities
        if declared.sampling is not None:
            callbacks["sampling_callback"] = self._sampling
            callbacks["sampling_capabilities"] = declared.sampling
        if declared.elicitation is not None:
            callbacks["elicitation_callback"] = self._elicitation
        return callbacks

    async def _forward_to_client(self, method: str, params: Any) -> dict[str, Any]:
        if self.ask_client is None:
            raise ClientRefused(types.INVALID_REQUEST, "the client cannot be asked")
        return await self.ask_client(
            method, params.model_dump(by_alias=True, mode="json", exclude_none=True)
        )

    async def _sampling(self, context: Any, params: types.CreateMessageRequestParams) -> Any:
        try:
            result = await self._forward_to_client("sampling/createMessage", params)
        except ClientRefused as refused:
            return types.ErrorData(code=refused.code, message=refused.message)
        for shape in (types.CreateMessageResult, types.CreateMessageResultWithTools):
            with contextlib.suppress(ValidationError):
                return shape.model_validate(result)
        return types.ErrorData(
            code=types.INVALID_PARAMS, message="the client's answer is not a sampling result"
        )

    async def _elicitation(self, context: Any, params: types.ElicitRequestParams) -> Any:
        try:
            result = await self._forward_to_client("elicitation/create", params)
        except ClientRefused as refused:
            return types.ErrorData(code=refused.code, message=refused.message)
        try:
            return types.ElicitResult.model_validate(result)
        except ValidationError:
            return types.ErrorData(
                code=types.INVALID_PARAMS,
                message="the client's answer is not an elicitation result",
            )

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
