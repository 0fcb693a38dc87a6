"""`/mcp/<name>/`: the MCP streamable-HTTP endpoint, an ASGI app in front of the console's.

Written against the transport's rules (MCP 2025-11-25, "Streamable HTTP") with the SDK's
types (`mcp_types`) validating every client request before it goes upstream:

- `POST` carries one JSON-RPC message. `initialize` (no `Mcp-Session-Id`) opens a session: a
  run, leased for the session's life, and a connection to the upstream; the answer carries
  the session id. Other requests need the id (missing: 400; unknown, ended or another team's:
  404 — the same answer, so a token cannot probe other teams' sessions).
- `tools/call` answers as JSON when nothing had to be sent before its answer, else as an SSE
  stream opened by the first thing that had to go (progress from the upstream, a keep-alive
  comment while the call waits for a reviewer, a stop notice), then the answer on it; the
  other requests answer as JSON.
- Notifications and responses answer 202. `notifications/cancelled` from the client cancels
  that call upstream (the call is then recorded failed or unknown, like a stop's). A response
  answers a request the upstream sent the client (`sampling/createMessage`,
  `elicitation/create`), which the gateway forwarded on the client's open stream: the
  standalone `GET` stream, else the stream of a call in flight.
- `GET` opens the session's standalone SSE stream (one per session, a second is a 409): the
  upstream's requests to the client, and a notice (`notifications/message`, level warning)
  when the run is stopped or taken over.
- `DELETE` ends the session: the client left, which is not a stop — the lease is released and
  the run interrupted.

Bad input never reaches a 500: a body over `SAFESTOP_MCP_MAX_MESSAGE_BYTES` is a 413, malformed
JSON a -32700, a batch or a malformed message a -32600, an unknown method a -32601, bad params
a -32602 — each a JSON-RPC error body.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from typing import Any

import mcp_types as types
from channels.db import database_sync_to_async
from django.conf import settings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION
from pydantic import ValidationError

from gateway import records
from gateway.sessions import REGISTRY, GatewaySession, RpcError, new_session_id
from gateway.upstream import UpstreamLink, UpstreamUnavailable
from runs.errors import DomainError

logger = logging.getLogger(__name__)

PATH = re.compile(r"^/mcp/([a-z0-9][a-z0-9_-]{0,63})/?$")
SESSION_HEADER = b"mcp-session-id"
# Requests forwarded unchanged (their results too); tools/call and tools/list are the gateway's.
PASS_THROUGH = {
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
}
KEEPALIVE_SECONDS = 15.0


def _header(scope: dict[str, Any], name: bytes) -> str:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return ""


def _client_ip(scope: dict[str, Any]) -> str:
    client = scope.get("client") or ("", 0)
    return str(client[0] or "")


def _error_body(rpc_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rpc_id, "error": error}


async def _send_json(
    send: Any,
    status: int,
    body: dict[str, Any] | None,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    payload = json.dumps(body).encode() if body is not None else b""
    out = [(b"content-type", b"application/json")] if body is not None else []
    out += headers or []
    out.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": payload})


class McpGateway:
    """Routes `/mcp/...` HTTP requests to the gateway, everything else to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path", "").startswith("/mcp/"):
            await handle(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _read_body(receive: Any, limit: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"\x00too-large"
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
    try:
        await _handle(scope, receive, send)
    except Exception:  # the last line: never a bare 500 page, always a JSON-RPC answer
        logger.exception("MCP gateway request failed")
        with contextlib.suppress(Exception):
            await _send_json(send, 500, _error_body(None, types.INTERNAL_ERROR, "internal error"))


async def _handle(scope: dict[str, Any], receive: Any, send: Any) -> None:
    match = PATH.match(scope["path"])
    if match is None:
        await _send_json(
            send, 404, _error_body(None, types.INVALID_REQUEST, "no such MCP endpoint")
        )
        return
    name = match.group(1)
    method = scope["method"]
    if method not in ("POST", "DELETE", "GET"):
        await _send_json(
            send,
            405,
            _error_body(
                None,
                types.INVALID_REQUEST,
                "use POST (GET for the session's stream, DELETE to end the session)",
            ),
            headers=[(b"allow", b"GET, POST, DELETE")],
        )
        return
    authorization = _header(scope, b"authorization")
    session_id = _header(scope, SESSION_HEADER)
    known = REGISTRY.get(session_id) if session_id else None
    if (
        known is not None
        and known.auth_header
        and hmac.compare_digest(authorization.encode(), known.auth_header.encode())
    ):
        auth = records.AuthAnswer(known.caller)  # the session's own token, still live
    else:
        auth = await database_sync_to_async(records.authenticate)(authorization, _client_ip(scope))
    if auth.caller is None:
        extra = [(b"www-authenticate", b"Bearer")]
        if auth.retry_after is not None:
            extra.append((b"retry-after", str(int(auth.retry_after) + 1).encode()))
        await _send_json(
            send, auth.status, _error_body(None, types.INVALID_REQUEST, auth.detail), headers=extra
        )
        return
    session = known
    if session is not None and (
        session.team_id != auth.caller.token.team_id or session.upstream_config.name != name
    ):
        session = None  # another team's session reads exactly like one that does not exist
    if method == "GET":
        await _standalone_stream(scope, receive, send, session, session_id)
        return
    if method == "DELETE":
        if session is None:
            await _send_json(send, 404, _error_body(None, types.INVALID_REQUEST, "no such session"))
            return
        await session.end(reason="client_closed")
        await _send_json(send, 200, None)
        return
    body = await _read_body(receive, int(settings.SAFESTOP_MCP_MAX_MESSAGE_BYTES))
    if body is None:
        return
    if body == b"\x00too-large":
        await _send_json(
            send,
            413,
            _error_body(
                None,
                types.INVALID_REQUEST,
                f"message larger than {settings.SAFESTOP_MCP_MAX_MESSAGE_BYTES} bytes",
            ),
        )
        return
    try:
        message = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        await _send_json(send, 400, _error_body(None, types.PARSE_ERROR, "body is not JSON"))
        return
    if isinstance(message, list):
        await _send_json(
            send,
            400,
            _error_body(None, types.INVALID_REQUEST, "JSON-RPC batches are not supported"),
        )
        return
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        await _send_json(
            send, 400, _error_body(None, types.INVALID_REQUEST, "not a JSON-RPC 2.0 message")
        )
        return
    rpc_id = message.get("id")
    rpc_method = message.get("method")
    if rpc_id is not None and (isinstance(rpc_id, bool) or not isinstance(rpc_id, (str, int))):
        await _send_json(
            send, 400, _error_body(None, types.INVALID_REQUEST, "id must be a string or an integer")
        )
        return
    if rpc_method is None:  # a response: the answer to a request forwarded from the upstream
        if session is not None:
            session.last_seen = time.monotonic()
            session.answer_from_client(message)
        await _send_json(send, 202, None)
        return
    if not isinstance(rpc_method, str):
        await _send_json(
            send, 400, _error_body(rpc_id, types.INVALID_REQUEST, "method must be a string")
        )
        return
    if rpc_method == "initialize" and rpc_id is not None:
        if session_id:
            await _send_json(
                send,
                400,
                _error_body(
                    rpc_id,
                    types.INVALID_REQUEST,
                    "initialize opens a session: send it without Mcp-Session-Id",
                ),
            )
            return
        await _initialize(scope, send, auth.caller, name, rpc_id, message)
        return
    if session is None:
        status, text = (
            (404, "no such session (it ended, or never existed)")
            if session_id
            else (
                400,
                "send initialize first; then every request carries Mcp-Session-Id",
            )
        )
        await _send_json(send, status, _error_body(rpc_id, types.INVALID_REQUEST, text))
        return
    session.last_seen = time.monotonic()
    if rpc_id is None:
        await _notification(session, rpc_method, message.get("params"))
        await _send_json(send, 202, None)
        return
    await _request(session, send, rpc_id, rpc_method, message.get("params"))


async def _notification(session: GatewaySession, method: str, params: Any) -> None:
    if method == "notifications/cancelled" and isinstance(params, dict):
        # The client gave up on a call: cancel it upstream (the SDK sends the cancel there).
        tool_call_id = f"mcp:{session.id[:16]}:{params.get('requestId')}"[:120]
        call = session.in_flight.get(tool_call_id)
        if call is not None and call.task is not None:
            call.task.cancel()


async def _initialize(
    scope: dict[str, Any],
    send: Any,
    caller: records.Caller,
    name: str,
    rpc_id: Any,
    message: dict[str, Any],
) -> None:
    try:
        request = types.InitializeRequest.model_validate(
            {"method": "initialize", "params": message.get("params")}
        )
    except ValidationError as error:
        await _send_json(
            send,
            400,
            _error_body(
                rpc_id,
                types.INVALID_PARAMS,
                f"invalid initialize params: {error.errors()[0]['msg']}",
            ),
        )
        return
    try:
        config = await database_sync_to_async(records.upstream_for)(caller.token.team_id, name)
    except DomainError:
        await _send_json(
            send,
            403,
            _error_body(
                rpc_id,
                types.INVALID_REQUEST,
                f"the upstream {name!r} is not on SAFESTOP_WEBHOOK_ALLOWED_HOSTS",
            ),
        )
        return
    if config is None:
        await _send_json(
            send,
            404,
            _error_body(
                rpc_id, types.INVALID_REQUEST, f"no upstream named {name!r} for this token's team"
            ),
        )
        return
    client = request.params.client_info
    session_id = new_session_id()
    env = dict(config.env)
    # Names the session in the upstream's environment: an operator (or a test) can find the
    # process tree a session started.
    env.setdefault("SAFESTOP_MCP_SESSION", session_id[:16])
    link = UpstreamLink(
        transport=config.transport,
        command=config.command,
        args=config.args,
        env=env,
        url=config.url,
        headers=config.headers,
        client_capabilities=request.params.capabilities,
    )
    session = GatewaySession(
        id=session_id,
        caller=caller,
        upstream_config=config,
        link=link,
        auth_header=_header(scope, b"authorization"),
    )
    link.ask_client = session.ask_client
    try:
        upstream_init = await link.start()
    except UpstreamUnavailable as error:
        await link.close()
        await _send_json(
            send,
            502,
            _error_body(
                rpc_id, types.INTERNAL_ERROR, f"the upstream {name!r} did not start: {error}"
            ),
        )
        return
    title = (getattr(client, "title", None) or client.name or "MCP client")[:180]
    try:
        await session.open(
            title=f"{title} via {name}",
            agent=(_header(scope, b"safestop-agent") or caller.token.name)[:120],
            client_name=client.name,
            client_version=client.version,
            attach_run_id=_header(scope, b"safestop-run-id")[:64],
        )
    except LookupError as error:
        await link.close()
        await _send_json(send, 404, _error_body(rpc_id, types.INVALID_REQUEST, str(error)))
        return
    except DomainError as error:
        await link.close()
        await _send_json(
            send,
            409,
            _error_body(
                rpc_id,
                types.INVALID_REQUEST,
                f"the run cannot be leased: {error.detail}",
                {"status": error.status},
            ),
        )
        return
    REGISTRY[session_id] = session
    wanted = request.params.protocol_version
    version = wanted if wanted in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION
    upstream_caps = upstream_init.capabilities.model_dump(
        by_alias=True, mode="json", exclude_none=True
    )
    capabilities = {
        key: upstream_caps[key]
        for key in ("tools", "resources", "prompts", "logging", "completions")
        if key in upstream_caps
    }
    capabilities.setdefault("tools", {})
    # The stop notice on the session's stream is a log message.
    capabilities.setdefault("logging", {})
    result = {
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": {
            "name": f"safestop/{name}",
            "title": f"{upstream_init.server_info.name} through safestop",
            "version": upstream_init.server_info.version,
        },
        "instructions": (
            (upstream_init.instructions or "")
            + f"\n\nTool calls pass through safestop (run {session.run_id}): a reviewer may "
            "hold, reject or stop them."
        ).strip(),
    }
    await _send_json(
        send,
        200,
        {"jsonrpc": "2.0", "id": rpc_id, "result": result},
        headers=[
            (b"mcp-session-id", session_id.encode()),
            (b"safestop-run-id", session.run_id.encode()),
        ],
    )


async def _request(
    session: GatewaySession, send: Any, rpc_id: Any, method: str, params: Any
) -> None:
    if method == "ping":
        await _send_json(send, 200, {"jsonrpc": "2.0", "id": rpc_id, "result": {}})
        return
    if method not in PASS_THROUGH and method not in ("tools/list", "tools/call"):
        await _send_json(
            send,
            200,
            _error_body(rpc_id, types.METHOD_NOT_FOUND, f"method not found: {method[:80]}"),
        )
        return
    try:
        request = types.client_request_adapter.validate_python(
            {"method": method, **({"params": params} if params is not None else {})}
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        await _send_json(
            send,
            200,
            _error_body(rpc_id, types.INVALID_PARAMS, f"invalid params ({where}): {first['msg']}"),
        )
        return
    if method == "tools/call":
        await _tools_call(session, send, rpc_id, request)
        return
    try:
        if method == "tools/list":
            result = await session.list_tools(request)
        else:
            result = await session._upstream(session.link.request(request))
    except RpcError as error:
        await _send_json(send, 200, _error_body(rpc_id, error.code, error.message, error.data))
        return
    await _send_json(send, 200, {"jsonrpc": "2.0", "id": rpc_id, "result": result})


async def _tools_call(session: GatewaySession, send: Any, rpc_id: Any, request: Any) -> None:
    """Answer a `tools/call`: plain JSON when nothing had to be sent before the answer, an SSE
    stream from the first thing that did (a progress notification, a keepalive while a reviewer
    decides, a stop notice, an upstream's request to the client).

    The stream is opened only when needed: the SDK clients read a JSON answer for much less than
    an SSE stream (docs/BENCHMARKS.md, MCP gateway), and most calls answer before anything else.
    """
    open_stream = True
    streaming = False

    async def event(data: dict[str, Any] | None, comment: str = "") -> bool:
        nonlocal open_stream, streaming
        if not open_stream:
            return False
        try:
            if not streaming:
                streaming = True
                await send(_sse_start(session))
            await send(_sse(data, comment))
        except Exception:  # the client left: the call goes on, and is recorded (not a cancel)
            open_stream = False
        return open_stream

    params = request.params
    token = _progress_token(params.meta)

    async def progress(value: float, total: float | None, message: str | None) -> None:
        if token is None:
            return
        note: dict[str, Any] = {"progressToken": token, "progress": value}
        if total is not None:
            note["total"] = total
        if message:
            note["message"] = message
        await event({"jsonrpc": "2.0", "method": "notifications/progress", "params": note})

    async def keepalive() -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_SECONDS)
            await event(None, "waiting")

    ticker = asyncio.create_task(keepalive())
    session.call_streams.append(event)
    try:
        result = await session.call_tool(
            rpc_id=rpc_id, name=params.name, arguments=params.arguments, progress=progress
        )
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id, "result": result}
    except RpcError as error:
        answer = _error_body(rpc_id, error.code, error.message, error.data)
    except Exception:  # the stream is open: the client still gets a JSON-RPC answer
        logger.exception("MCP gateway: tools/call failed")
        answer = _error_body(rpc_id, types.INTERNAL_ERROR, "internal error")
    finally:
        ticker.cancel()
        session.call_streams.remove(event)
    with contextlib.suppress(Exception):  # the client may have left: the call is recorded
        if not streaming:
            await _send_json(send, 200, answer, headers=[(b"mcp-session-id", session.id.encode())])
        elif open_stream:  # the answer ends the stream: one message to the server, not two
            await send({**_sse(answer), "more_body": False})


def _progress_token(meta: Any) -> Any:
    """The client's `_meta.progressToken`: the SDK's types give `_meta` as a dict (snake_case
    keys) in mcp 2.x, as an object before."""
    if isinstance(meta, dict):
        return meta.get("progress_token", meta.get("progressToken"))
    return getattr(meta, "progress_token", None) if meta is not None else None


def _sse_start(session: GatewaySession) -> dict[str, Any]:
    """The start of a session's SSE answer (a call's stream, or the session's own)."""
    return {
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"),
            (b"mcp-session-id", session.id.encode()),
        ],
    }


def _sse(data: dict[str, Any] | None, comment: str = "") -> dict[str, Any]:
    text = f": {comment}\n\n" if data is None else f"event: message\ndata: {json.dumps(data)}\n\n"
    return {"type": "http.response.body", "body": text.encode(), "more_body": True}


async def _standalone_stream(
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    session: GatewaySession | None,
    session_id: str,
) -> None:
    """The session's own SSE stream (`GET`): open until the client leaves or the session ends."""
    if session is None:
        status, text = (
            (404, "no such session (it ended, or never existed)")
            if session_id
            else (400, "GET opens the stream of a session: send its Mcp-Session-Id")
        )
        await _send_json(send, status, _error_body(None, types.INVALID_REQUEST, text))
        return
    if "text/event-stream" not in _header(scope, b"accept"):
        await _send_json(
            send,
            406,
            _error_body(None, types.INVALID_REQUEST, "GET needs Accept: text/event-stream"),
        )
        return
    if session.events is not None:
        await _send_json(
            send,
            409,
            _error_body(None, types.INVALID_REQUEST, "this session's stream is already open"),
        )
        return
    await send(_sse_start(session))
    open_stream = True

    async def write(data: dict[str, Any] | None, comment: str = "") -> bool:
        nonlocal open_stream
        if open_stream:
            try:
                await send(_sse(data, comment))
            except Exception:
                open_stream = False
        return open_stream

    async def writer(message: dict[str, Any]) -> bool:
        return await write(message)

    session.events = writer
    if session.stop_notice is not None:
        await write(session.stop_notice)
    left = asyncio.create_task(_disconnected(receive))
    gone = asyncio.create_task(session.gone.wait())
    try:
        while open_stream:
            done, _ = await asyncio.wait(
                {left, gone}, timeout=KEEPALIVE_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                break
            await write(None, "open")
    finally:
        left.cancel()
        gone.cancel()
        if session.events is writer:
            session.events = None
    if open_stream:
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
