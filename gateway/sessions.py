"""A gateway session: one MCP client, one upstream connection, one leased run.

The session is the run's worker. It holds the lease (heartbeats in a task), hears the stop
signal and approval decisions on the run's agent group (`runs.groups.agent_group`, the same
push an SDK worker gets over its websocket; the heartbeat answer is the fallback), asks a
permit for every `tools/call`, and after a stop cancels the calls in flight upstream and
drains with what it observed — a write whose answer never came is left for the settle to
record `unknown`, so the run ends `stopped_dirty` with it in the packet.

Sessions live in this process's memory (`REGISTRY`): behind several daphne processes, a
proxy must route one `Mcp-Session-Id` to one process (docs/OPERATIONS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED
from pydantic import ValidationError

from gateway import records
from gateway.lane import Lane, News
from gateway.lane import db as _db
from gateway.records import Caller, StopFacts, UpstreamConfig
from gateway.services import session_ended
from gateway.upstream import ClientRefused, UpstreamLink, UpstreamUnavailable
from runs import services
from runs.actors import Actor
from runs.errors import ApprovalClosed, DomainError, LeaseRevoked, RunNotRunning, StaleEpoch
from runs.groups import agent_group, token_group
from runs.models import ExecutionState, SideEffect

logger = logging.getLogger(__name__)

OBSERVATION_CHARS = 2000
# Sends one JSON-RPC message on a client's SSE stream; False when that stream is gone.
Writer = Callable[[dict[str, Any]], Awaitable[bool]]


# A call's permit's frames wait this long for its result's, to be published with them.
NEWS_DELAY_SECONDS = 0.02


class ToolError(Exception):
    """A tools/call answered with `isError: true`: the model reads the text and goes on."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def result(self) -> dict[str, Any]:
        return {"content": [{"type": "text", "text": self.text}], "isError": True}


class RpcError(Exception):
    """A JSON-RPC error answer (bad params, a refused request, an upstream's own error)."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


@dataclass
class InFlight:
    tool_call_id: str
    tool: str
    side_effect: str
    task: asyncio.Task[Any] | None = None
    approval_id: int | None = None
    decision: asyncio.Future[dict[str, Any]] | None = None


class _ProgressAfterPermit:
    """A read forwarded beside its permit: its progress notifications wait for the permit, so
    the client hears nothing of a call safestop may yet refuse."""

    def __init__(self, progress: Callable[[float, float | None, str | None], Awaitable[None]]):
        self._progress = progress
        self._kept: list[tuple[float, float | None, str | None]] = []
        self._granted = False

    async def send(self, progress: float, total: float | None, message: str | None) -> None:
        if self._granted:
            await self._progress(progress, total, message)
        else:
            self._kept.append((progress, total, message))

    async def release(self) -> None:
        while self._kept:
            await self._progress(*self._kept.pop(0))
        self._granted = True


def _settle_granted(granted: asyncio.Future[bool], holds_possible: bool) -> None:
    if not granted.done():
        granted.set_result(holds_possible)


def _granted_on(
    loop: asyncio.AbstractEventLoop, granted: asyncio.Future[bool]
) -> Callable[[bool], None]:
    """`permit_request`'s `on_granted`, called on the lane's thread: answers `granted` on `loop`."""

    def tell(holds_possible: bool) -> None:
        loop.call_soon_threadsafe(_settle_granted, granted, holds_possible)

    return tell


def _retrieve(task: asyncio.Task[Any]) -> None:
    # A read forwarded beside a permit that was refused: nobody awaits its answer.
    if not task.cancelled():
        task.exception()


def _stop_text(facts: StopFacts | None) -> str:
    if facts is None:
        return "The run was stopped; no further tool calls are allowed."
    what = "taken over" if facts.takeover else "stopped"
    text = f"The run was {what} by {facts.requested_by} (reason: {facts.reason})"
    if facts.note:
        text += f": {facts.note}"
    return text + ". No further tool calls are allowed in this session."


def _observation(result: dict[str, Any]) -> tuple[str, bool]:
    parts = []
    for block in result.get("content") or []:
        if isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict):
            parts.append(f"[{block.get('type', 'content')}]")
    text = "\n".join(parts)
    return text[:OBSERVATION_CHARS], len(text) > OBSERVATION_CHARS


@dataclass
class GatewaySession:
    id: str
    caller: Caller
    upstream_config: UpstreamConfig
    link: UpstreamLink
    run_id: str = ""
    lease_token: str = ""
    epoch: int = 0
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    stop_facts: StopFacts | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    stop_done: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # set when the session ends
    ended: bool = False
    last_seen: float = field(default_factory=time.monotonic)
    # The Authorization header that opened the session: a later request with the same header
    # skips the token lookup (one database hop less per call). A revocation still ends the
    # session at once: the session listens on the token's group (`runs.groups.token_group`).
    auth_header: str = ""
    # Where a message for the client can go: the standalone GET stream (`events`), else the
    # SSE streams of the calls in flight, newest last. Each is an async writer of one message.
    events: Writer | None = None
    # Sent on the stream when the run stops, and again on a stream opened after (a client that
    # opens or reopens it late still hears why its calls are refused).
    stop_notice: dict[str, Any] | None = None
    call_streams: list[Writer] = field(default_factory=list)
    # Requests forwarded to the client (sampling, elicitation), by their JSON-RPC id.
    asked: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _asked_seq: int = 0
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    # The permits and results of this session's calls, in order (`gateway.lane`).
    _lane: Lane = field(default_factory=Lane)
    _news: News = field(default_factory=lambda: News(NEWS_DELAY_SECONDS))
    _reports: set[asyncio.Task[Any]] = field(default_factory=set)
    _channel: str = ""
    # Whether the session's last permit said nothing could hold a call (the team has no
    # approval rule and never had a policy): the next read then goes beside its permit.
    _reads_beside_permit: bool = False

    @property
    def team_id(self) -> int:
        return int(self.caller.token.team_id)

    # --- opening ---------------------------------------------------------------------------

    async def open(
        self, *, title: str, agent: str, client_name: str, client_version: str, attach_run_id: str
    ) -> None:
        opened = await _db(records.open_run)(
            caller=self.caller,
            session_id=self.id,
            upstream_id=self.upstream_config.id,
            title=title,
            agent=agent,
            client_name=client_name,
            client_version=client_version,
            attach_run_id=attach_run_id,
            ttl_seconds=float(settings.SAFESTOP_MCP_LEASE_TTL_SECONDS),
        )
        self.run_id, self.lease_token, self.epoch = opened.run_id, opened.lease_token, opened.epoch
        layer = get_channel_layer()
        if layer is not None:
            self._channel = await layer.new_channel()
            await layer.group_add(agent_group(self.run_id), self._channel)
            await layer.group_add(token_group(self.caller.token.pk), self._channel)
            self._tasks.append(asyncio.create_task(self._listen(layer), name="mcp-signals"))
        self._tasks.append(asyncio.create_task(self._heartbeat(), name="mcp-heartbeat"))
        self._tasks.append(asyncio.create_task(self._watch_upstream(), name="mcp-upstream-watch"))

    # --- signals -----------------------------------------------------------------------------

    async def _listen(self, layer: Any) -> None:
        while not self.ended:
            message = await layer.receive(self._channel)
            kind = message.get("type")
            if kind == "stop.signal":
                self.on_stop()
            elif kind == "token.revoked":
                asyncio.create_task(self.end(reason="token_revoked"))
            elif kind == "approval.decided":
                decision = message.get("decision") or {}
                self._deliver_decision(str(decision.get("tool_call_id") or ""), decision)

    def _deliver_decision(self, tool_call_id: str, decision: dict[str, Any]) -> None:
        call = self.in_flight.get(tool_call_id)
        if call is not None and call.decision is not None and not call.decision.done():
            call.decision.set_result(decision)

    async def _heartbeat(self) -> None:
        ttl = float(settings.SAFESTOP_MCP_LEASE_TTL_SECONDS)
        idle = float(settings.SAFESTOP_MCP_SESSION_IDLE_SECONDS)
        while not self.ended:
            await asyncio.sleep(ttl / 3)
            if self.ended or self.stopping.is_set():
                return
            if time.monotonic() - self.last_seen > idle:
                # A client that vanished without DELETE: the same as a disconnect.
                asyncio.create_task(self.end(reason="idle"))
                return
            try:
                answer = await _db(services.lease_heartbeat)(
                    run_id=self.run_id,
                    lease_token=self.lease_token,
                    epoch=self.epoch,
                    actor=self.caller.actor,
                )
            except LeaseRevoked:
                self.on_stop()
                return
            except DomainError:
                logger.exception("MCP session %s: heartbeat refused", self.id[:12])
                continue
            if answer.signal is not None:
                self.on_stop()

    async def _watch_upstream(self) -> None:
        """An upstream that exits under a live session is a dependency failure: stop the run
        (the agent's own token may stop for that), so nobody waits on a dead tool server."""
        await self.link.closed.wait()
        if self.ended or self.stopping.is_set():
            return
        # The calls in flight see the connection close too: let them record their outcome
        # (a write: unknown) before the stop settles the run.
        running = [c.task for c in self.in_flight.values() if c.task is not None]
        if running:
            await asyncio.wait(running, timeout=5.0)
        for _ in range(100):
            if not any(c.task is not None for c in self.in_flight.values()):
                break
            await asyncio.sleep(0.01)
        await _db(services.run_stop)(
            run_id=self.run_id,
            reason="dependency_failure",
            actor=self.caller.actor,
            note=f"the MCP upstream {self.upstream_config.name} exited: {self.link.error}"[:500],
        )
        self.on_stop()

    def on_stop(self) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        asyncio.create_task(self._stop_work(), name="mcp-stop")

    async def _stop_work(self) -> None:
        """Act as the worker after a stop: cancel the calls in flight upstream (the SDK sends
        `notifications/cancelled`), say what was observed, drain, then kill the upstream."""
        try:
            self.stop_facts = await _db(records.stop_facts)(self.run_id)
            await self._stop_notice()
            observations = []
            for call in list(self.in_flight.values()):
                if call.task is not None and not call.task.done():
                    call.task.cancel()
                    observation: dict[str, Any] = {
                        "tool_call_id": call.tool_call_id,
                        "remote_cancel_state": "requested",
                        "observation": "no answer before the stop; notifications/cancelled sent "
                        "to the upstream",
                    }
                    if call.side_effect == SideEffect.NONE:
                        # A read that never answered changed nothing: it failed, cleanly.
                        observation["execution_state"] = ExecutionState.FAILED
                    else:
                        # A write may have happened: unknown, for a person to resolve.
                        observation["execution_state"] = ExecutionState.UNKNOWN
                    observations.append(observation)
            for call in list(self.in_flight.values()):
                if call.task is not None:
                    with contextlib.suppress(BaseException):
                        await call.task
            await self._reports_done()
            with contextlib.suppress(DomainError):
                await _db(services.run_drained)(
                    run_id=self.run_id,
                    lease_token=self.lease_token,
                    epoch=self.epoch,
                    actor=self.caller.actor,
                    observations=observations,
                )
        except Exception:
            logger.exception("MCP session %s: draining after the stop failed", self.id[:12])
        finally:
            self.stop_done.set()
            await self.link.close()

    async def _stop_notice(self) -> None:
        """Tell the client on the session's own stream (when it keeps one open): a client
        between calls hears of the stop before its next call is refused."""
        self.stop_notice = {
            "jsonrpc": "2.0",
            "method": "notifications/message",
            "params": {
                "level": "warning",
                "logger": "safestop",
                "data": _stop_text(self.stop_facts),
            },
        }
        if self.events is not None:
            with contextlib.suppress(Exception):
                await self.events(self.stop_notice)

    # --- calls -------------------------------------------------------------------------------

    def side_effect_of(self, tool: str) -> str:
        annotations = (self.tools.get(tool) or {}).get("annotations") or {}
        return SideEffect.NONE if annotations.get("readOnlyHint") is True else SideEffect.WRITE

    async def list_tools(self, request: Any) -> dict[str, Any]:
        if self.stopping.is_set() and not self.link.alive:
            return {"tools": list(self.tools.values())}
        result = await self._upstream(self.link.request(request))
        for tool in result.get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                self.tools[tool["name"]] = tool
        return result

    async def _upstream(self, call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        try:
            return await call
        except UpstreamUnavailable as error:
            raise RpcError(-32603, f"the upstream is not available: {error}") from error
        except MCPError as error:
            raise RpcError(error.code, error.message, error.error.data) from error
        except ValidationError as error:  # the upstream answered something that is not MCP
            raise RpcError(-32603, f"the upstream's answer is not valid MCP: {error}") from error

    async def call_tool(
        self,
        *,
        rpc_id: Any,
        name: str,
        arguments: dict[str, Any] | None,
        progress: Callable[[float, float | None, str | None], Awaitable[None]] | None,
    ) -> dict[str, Any]:
        try:
            return await self._call_tool(rpc_id, name, arguments, progress)
        except ToolError as error:
            return error.result()

    async def _call_tool(
        self,
        rpc_id: Any,
        name: str,
        arguments: dict[str, Any] | None,
        progress: Any,
    ) -> dict[str, Any]:
        if self.stopping.is_set():
            raise ToolError(
                _stop_text(self.stop_facts or await _db(records.stop_facts)(self.run_id))
            )
        if name not in self.tools and self.link.alive:
            with contextlib.suppress(RpcError):
                await self.list_tools(_list_tools_request())
        side_effect = self.side_effect_of(name)
        tool_call_id = f"mcp:{self.id[:16]}:{rpc_id}"[:120]
        call = InFlight(tool_call_id=tool_call_id, tool=name, side_effect=side_effect)
        if tool_call_id in self.in_flight:
            raise RpcError(-32600, f"request id {rpc_id!r} is already in flight in this session")
        self.in_flight[tool_call_id] = call
        try:
            if side_effect == SideEffect.NONE and self._reads_beside_permit:
                return await self._read_beside_permit(call, arguments, progress)
            arguments = await self._permit(call, arguments)
            return await self._forward(call, arguments, progress)
        finally:
            self.in_flight.pop(tool_call_id, None)

    async def _read_beside_permit(
        self, call: InFlight, arguments: dict[str, Any] | None, progress: Any
    ) -> dict[str, Any]:
        """Forward a read at once and ask its permit meanwhile; answer only once it is granted.

        A read changes nothing upstream (its tool says `readOnlyHint`), so what may run before
        its permit is what a draining run lets finish anyway (DESIGN §2): the client sees the
        answer only if the permit was granted, so only if no stop came first, and a refused or
        held call is cancelled upstream like any call in flight at a stop. Only while nothing
        could hold the call (`_reads_beside_permit`): where a rule or a policy might, nothing
        runs before its permit. The call then takes the longer of the permit and the upstream,
        not their sum.

        "Granted" is the permit's decision, taken under the run lock (`on_granted`), not its
        commit: the lock is held until the record commits, so no stop can come in between, and
        the record's write (a round trip and a COMMIT) is no longer on the read's path. It
        commits behind the answer, in the session's lane, before the call's result.
        """
        started = time.monotonic()
        kept = _ProgressAfterPermit(progress) if progress is not None else None
        call.task = asyncio.create_task(
            self.link.call_tool(call.tool, arguments, kept.send if kept else None)
        )
        call.task.add_done_callback(_retrieve)
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        permit = asyncio.ensure_future(self._permit(call, arguments, granted=granted))
        try:
            either: set[asyncio.Future[Any]] = {granted, permit}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if granted.done():
                final = arguments
                self._reads_beside_permit = not granted.result()
                self._committing(permit)
            else:
                final = permit.result()  # a refusal raises; a held call answers its decision
        except BaseException:
            permit.cancel()
            call.task.cancel()  # the SDK sends notifications/cancelled upstream
            raise
        if call.approval_id is not None:
            # Held after all (a rule added since the session's last permit), then approved: the
            # early answer is as old as the reviewer's wait, and answers the arguments as first
            # asked, which the reviewer may have changed. The call runs again, now.
            call.task.cancel()
            return await self._forward(call, final, progress)
        if kept is not None:
            await kept.release()
        return await self._forward(call, final, progress, running=call.task, started=started)

    def _committing(self, permit: asyncio.Future[Any]) -> None:
        """A permit granted and answered on, whose record is still being written: a drain waits
        for it as for a result (`_reports_done`). It cannot be refused any more; a failed write
        (the database gone) is logged, and the call's result then finds no record to report."""
        self._reports.add(permit)  # type: ignore[arg-type]
        permit.add_done_callback(self._reports.discard)  # type: ignore[arg-type]
        permit.add_done_callback(self._log_unwritten)

    def _log_unwritten(self, permit: asyncio.Future[Any]) -> None:
        if not permit.cancelled() and permit.exception() is not None:
            logger.error(
                "MCP session %s: a granted permit was not written",
                self.id[:12],
                exc_info=permit.exception(),
            )

    async def _permit(
        self,
        call: InFlight,
        arguments: dict[str, Any] | None,
        granted: asyncio.Future[bool] | None = None,
    ) -> dict[str, Any] | None:
        """The call's permit (a held call: its reviewer's decision); the arguments to run.
        `granted`: answered with `holds_possible` as soon as the permit is decided, before its
        record is written (`permit_request`'s `on_granted`)."""
        loop = asyncio.get_running_loop()
        try:
            (record, _), events = await self._lane.submit(
                services.permit_request,
                held=True,
                on_granted=None if granted is None else _granted_on(loop, granted),
                run_id=self.run_id,
                epoch=self.epoch,
                actor=self.caller.actor,
                request=services.PermitRequest(
                    tool_call_id=call.tool_call_id,
                    tool=call.tool,
                    side_effect=call.side_effect,
                    arguments=arguments or {},
                    summary=f"MCP {self.upstream_config.name}: {call.tool}",
                ),
            )
        except (RunNotRunning, StaleEpoch) as error:
            facts = await _db(records.stop_facts)(self.run_id)
            if facts is not None and error.status not in ("completed", "failed"):
                self.on_stop()
                raise ToolError(_stop_text(facts)) from error
            raise ToolError(f"safestop refused the call: {error.detail}") from error
        except ApprovalClosed as error:
            raise ToolError(f"safestop refused the call: {error.detail}") from error
        except DomainError as error:
            raise RpcError(-32602, f"safestop refused the call: {error.detail}") from error
        self._news.later(events)
        self._reads_beside_permit = not record.holds_possible
        if record.execution_state != ExecutionState.AWAITING_APPROVAL:
            return arguments
        call.approval_id = record.approval.pk
        decision = await self._wait_for_decision(call)
        status = decision.get("status") or ""
        if status == "approved":
            final = decision.get("arguments")
            return final if isinstance(final, dict) else arguments
        message = decision.get("message") or ""
        what = {
            "rejected": "rejected",
            "expired": "expired before a reviewer decided",
            "void": "void",
        }
        text = f"A reviewer {what.get(status, status)} this call"
        if status == "void":
            text = "The approval was voided (the run stopped or lost its lease)"
        raise ToolError(text + (f": {message}" if message else "."))

    async def _wait_for_decision(self, call: InFlight) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        call.decision = loop.create_future()
        assert call.approval_id is not None
        stopping = asyncio.create_task(self.stopping.wait())
        try:
            while True:
                # The push is the fast path; reading the approval is the fallback for a lost one.
                early = await _db(records.approval_state)(call.approval_id)
                if early is not None:
                    return early
                waiting: set[asyncio.Future[Any]] = {call.decision, stopping}
                done, _ = await asyncio.wait(
                    waiting, timeout=5.0, return_when=asyncio.FIRST_COMPLETED
                )
                if call.decision in done:
                    return call.decision.result()
                if stopping in done:
                    raise ToolError(
                        _stop_text(self.stop_facts or await _db(records.stop_facts)(self.run_id))
                    )
        finally:
            stopping.cancel()

    async def _forward(
        self,
        call: InFlight,
        arguments: dict[str, Any] | None,
        progress: Any,
        *,
        running: asyncio.Task[dict[str, Any]] | None = None,
        started: float | None = None,
    ) -> dict[str, Any]:
        """The call at the upstream (`running`: already forwarded, at `started`), its answer to
        the client and its result recorded."""
        if running is None:
            started = time.monotonic()
            running = asyncio.create_task(self.link.call_tool(call.tool, arguments, progress))
        assert started is not None
        call.task = running
        try:
            result = await asyncio.shield(call.task)
        except asyncio.CancelledError:
            if call.task.cancelled() and self.stopping.is_set():
                # Cancelled by the stop, which reports the outcome in its drain.
                raise ToolError(
                    _stop_text(self.stop_facts or await _db(records.stop_facts)(self.run_id))
                    + " This call was cancelled at the upstream."
                ) from None
            raise
        except (UpstreamUnavailable, MCPError) as error:
            crashed = isinstance(error, UpstreamUnavailable) or error.code == CONNECTION_CLOSED
            if crashed:
                await self._report(
                    call,
                    ExecutionState.UNKNOWN
                    if call.side_effect == SideEffect.WRITE
                    else ExecutionState.FAILED,
                    f"the upstream exited mid-call: {error}",
                    started,
                )
                raise ToolError(f"The tool server exited during the call ({error}).") from error
            await self._report(call, ExecutionState.FAILED, f"upstream error: {error}", started)
            assert isinstance(error, MCPError)
            raise RpcError(error.code, error.message, error.error.data) from error
        state = ExecutionState.FAILED if result.get("isError") else ExecutionState.SUCCEEDED
        text, truncated = _observation(result)
        # The answer goes to the client now; the result is recorded beside it (one database
        # hop less per call), queued in the session's lane before the answer leaves, so the
        # session's next permit comes after it. A stop or the session's end waits for these
        # reports first, so a drain never calls unknown a call whose answer the gateway has.
        report = asyncio.create_task(
            self._recorded(call, self._record(call, state, text, started, truncated=truncated))
        )
        self._reports.add(report)
        report.add_done_callback(self._reports.discard)
        return result

    async def _reports_done(self) -> None:
        if self._reports:
            await asyncio.wait(set(self._reports))
        await self._lane.idle()

    async def _report(
        self, call: InFlight, state: str, text: str, started: float, *, truncated: bool = False
    ) -> None:
        await self._recorded(call, self._record(call, state, text, started, truncated=truncated))

    def _record(
        self, call: InFlight, state: str, text: str, started: float, *, truncated: bool = False
    ) -> asyncio.Future[Any]:
        """Queue the call's result in the session's lane (`tool_result_report`)."""
        took = time.monotonic() - started
        return self._lane.submit(
            services.tool_result_report,
            held=True,
            run_id=self.run_id,
            tool_call_id=call.tool_call_id,
            execution_state=state,
            actor=self.caller.actor,
            observation=f"{text}\n[{took * 1000:.1f} ms via the MCP gateway]"[
                : OBSERVATION_CHARS + 40
            ],
            output_truncated=truncated,
            source="mcp-gateway",
        )

    async def _recorded(self, call: InFlight, recording: asyncio.Future[Any]) -> None:
        try:
            _, events = await recording
        except DomainError:
            logger.exception(
                "MCP session %s: result of %s refused", self.id[:12], call.tool_call_id
            )
            return
        self._news.now(events)

    # --- the client's side of the session: what the gateway sends it unasked ---------------

    async def tell_client(self, message: dict[str, Any]) -> bool:
        """Send a message to the client on its open stream; False when none is open."""
        for writer in ([self.events] if self.events else []) + self.call_streams[::-1]:
            if await writer(message):
                return True
        return False

    async def ask_client(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Forward an upstream's request (sampling, elicitation) to the client and wait for its
        answer, which it POSTs as a JSON-RPC response (`answer_from_client`)."""
        self._asked_seq += 1
        rpc_id = f"safestop-{self._asked_seq}"
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.asked[rpc_id] = answer
        try:
            request = {"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}
            if not await self.tell_client(request):
                raise ClientRefused(-32603, "the client has no open stream to be asked on")
            stopping = asyncio.ensure_future(self.stopping.wait())
            waiting: set[asyncio.Future[Any]] = {answer, stopping}
            try:
                done, _ = await asyncio.wait(
                    waiting,
                    timeout=float(settings.SAFESTOP_MCP_CLIENT_ANSWER_SECONDS),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                stopping.cancel()
            if answer not in done:
                raise ClientRefused(
                    -32603, "the run was stopped" if self.stopping.is_set() else "no answer"
                )
            return answer.result()
        finally:
            self.asked.pop(rpc_id, None)

    def answer_from_client(self, message: dict[str, Any]) -> bool:
        """A JSON-RPC response the client POSTed: the answer to one of `ask_client`'s."""
        answer = self.asked.get(str(message.get("id")))
        if answer is None or answer.done():
            return False
        error = message.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            answer.set_exception(
                ClientRefused(
                    code if isinstance(code, int) else -32603, str(error.get("message", ""))[:500]
                )
            )
        elif isinstance(message.get("result"), dict):
            answer.set_result(message["result"])
        else:
            answer.set_exception(ClientRefused(-32600, "a response needs a result or an error"))
        return True

    # --- ending ------------------------------------------------------------------------------

    async def end(self, *, reason: str) -> None:
        """The client went away (DELETE, or idle): not a stop. The lease is released, so a
        running run is interrupted (what was in flight becomes unknown), never stopped."""
        if self.ended:
            return
        self.ended = True
        self.gone.set()
        REGISTRY.pop(self.id, None)
        if self.stopping.is_set():
            await self.stop_done.wait()
        else:
            for call in list(self.in_flight.values()):
                if call.task is not None:
                    call.task.cancel()
            await self._reports_done()
            with contextlib.suppress(DomainError):
                await _db(services.lease_release)(
                    run_id=self.run_id,
                    lease_token=self.lease_token,
                    epoch=self.epoch,
                    actor=self.caller.actor,
                )
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()
        layer = get_channel_layer()
        if layer is not None and self._channel:
            with contextlib.suppress(Exception):
                await layer.group_discard(agent_group(self.run_id), self._channel)
                await layer.group_discard(token_group(self.caller.token.pk), self._channel)
        self._news.now()
        await _db(session_ended)(public_id=self.id, reason=reason)
        await self.link.close()


def _list_tools_request() -> Any:
    import mcp_types as types

    return types.ListToolsRequest()


REGISTRY: dict[str, GatewaySession] = {}


def new_session_id() -> str:
    return secrets.token_urlsafe(24)


__all__ = ["REGISTRY", "Actor", "GatewaySession", "RpcError", "ToolError", "new_session_id"]
