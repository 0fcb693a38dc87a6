"""One leased run, as the worker sees it: lease, stop signals, steps, tool calls, drain.

    with client.lease(run_id, "worker-1") as run:
        with run.step("search", "Search the docs", kind="tool_read"):
            with run.tool_call("search", {"q": "refund"}) as call:
                call.result = search("refund")
        run.complete({"answer": "..."})

The rules this module keeps (DESIGN §1, seed §3–§5):

- No tool starts without a permit asked at this lease's epoch; a refused permit
  sets the token and raises `Cancelled` before the tool body runs.
- No tool starts without a `permit_id`. A call that needs approval (DESIGN §10)
  waits for the reviewer's decision, still obeying the token; it runs with the
  approved (possibly edited) arguments, or raises `ApprovalRejected`.
- Every permitted call reports an outcome. A write whose outcome nobody saw is
  reported `unknown`, never `failed`: it may have happened.
- Facts (results, completed steps) are retried and sent even after a stop; new
  work (permits, step starts, outbox items) is not.
- Leaving the block after a stop reports `drained`; otherwise the lease is released.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from decimal import Decimal
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import httpx

from .approvals import (
    NOT_GIVEN,
    ApprovalBoard,
    ApprovalDecision,
    decision_from_approval,
    decision_from_frame,
)
from .cancel import Cancelled, CancelToken
from .errors import (
    REFUSAL_CODES,
    ApiError,
    ApprovalRejected,
    NoPermit,
    Refused,
    ToolCallConflict,
)
from .retry import retry
from .signals import HeartbeatLoop, PushListener
from .usage import usage_fields
from .wire import (
    EventAnswer,
    ExecutionState,
    OutboxItemInfo,
    PermitAsk,
    PermitInfo,
    RecoveryPolicy,
    RemoteCancelState,
    Risk,
    SideEffect,
    WireClient,
)

if TYPE_CHECKING:
    from .process import ProcessResult

log = logging.getLogger("safestop_agent")

StepKind = Literal["model_call", "tool_read", "tool_write", "external_action"]

# Facts are worth a few quick retries: the server accepts them even after a stop,
# and every one carries a client id (event_id, tool_call_id), so a repeat is harmless.
FACT_ATTEMPTS = 4
FACT_BASE_DELAY = 0.2

# While a call waits for approval its decision is pushed at once; the approval's
# GET is asked this often in case a push was missed (DESIGN §10: the fallback).
APPROVAL_POLL_SECONDS = 3.0
# A stop voids the approvals that wait, and its signal may reach us just after
# the void: wait this long for it, so a stop surfaces as `Cancelled`.
VOID_GRACE_SECONDS = 1.0

_UNSET: Any = object()
# The run statuses in which a worker may go on working (the server's own list).
OPEN_STATUSES = frozenset({"pending", "running", "suspended", "interrupted"})


def _is_network_error(error: Exception) -> bool:
    return isinstance(error, httpx.TransportError) or (
        isinstance(error, ApiError) and error.is_transient
    )


@dataclass
class ToolCall(PermitAsk):
    """What the worker knows about one permitted tool call; filled in by the tool body.

    The permit request's fields (`PermitAsk`) first, in the order `new_tool_call` gives them."""

    permit: Mapping[str, Any] = field(default_factory=dict)
    # Approval (DESIGN §10): the approval the call waited for, and its decision.
    # `arguments` become the approved ones; `original_arguments` keeps the model's.
    approval: Mapping[str, Any] | None = None
    decision: ApprovalDecision | None = None
    original_arguments: Any = field(default=None, init=False)
    observations: list[str] = field(default_factory=list)
    output_truncated: bool = False
    remote_cancel_state: RemoteCancelState | None = None
    execution_state: ExecutionState | None = None
    declared_state: ExecutionState | None = None
    reported: bool = False
    _result: Any = field(default=_UNSET, repr=False)

    def __post_init__(self) -> None:
        self.original_arguments = self.arguments

    @property
    def arguments_edited(self) -> bool:
        """True when a reviewer approved different arguments than the model asked for."""
        decided = self.decision is not None or self.approval is not None
        return decided and self.arguments != self.original_arguments

    @property
    def result(self) -> Any:
        return None if self._result is _UNSET else self._result

    @result.setter
    def result(self, value: Any) -> None:
        """Record the outcome as soon as it is known, so a later stop cannot turn it into `unknown`."""
        self._result = value

    @property
    def has_result(self) -> bool:
        return self._result is not _UNSET

    def set_operation_id(self, operation_id: str) -> None:
        """The remote system's id for this operation: what a human queries to verify it."""
        self.operation_id = operation_id

    def observe(self, text: str, *, truncated: bool = False) -> None:
        """Record what was seen so far; the last observation goes into the report."""
        self.observations.append(text)
        self.output_truncated = self.output_truncated or truncated

    def set_remote_cancel_state(self, state: RemoteCancelState) -> None:
        self.remote_cancel_state = state

    def set_execution_state(self, state: ExecutionState) -> None:
        """Say how the call ended when the tool itself knows (e.g. the remote said "failed")."""
        self.declared_state = state

    def observe_process(self, result: ProcessResult) -> None:
        """Record a `run_process` outcome: output, truncation, and how it ended.

        Exit 0 is the result. A process we killed proves nothing about a
        write (`unknown`); one that exited non-zero by itself said it failed.
        """
        output = result.stdout.decode("utf-8", errors="replace")
        self.observe(f"[{result.summary()}]\n{output}", truncated=result.output_truncated)
        if result.returncode == 0 and not result.killed:
            self.result = output
        elif result.killed or result.returncode is None:
            self.set_execution_state("unknown" if self.side_effect == "write" else "failed")
        else:
            self.set_execution_state("failed")

    @property
    def last_observation(self) -> str | None:
        return self.observations[-1] if self.observations else None

    def drain_observation(self) -> dict[str, Any]:
        """The call as a drain observation.

        The server applies an observation that carries `execution_state` as a
        tool result, so only facts it has not received yet carry one: the
        outcome whose report failed, or `running` for a call still in flight.
        """
        observation: dict[str, Any] = {
            "kind": "tool_call",
            "tool_call_id": self.tool_call_id,
            "tool": self.tool,
            "side_effect": self.side_effect,
            "reported": self.reported,
        }
        if not self.reported:
            observation.update(
                execution_state=self.execution_state or "running",
                observation=self.last_observation or "",
                output_truncated=self.output_truncated,
            )
            if self.operation_id:
                observation["operation_id"] = self.operation_id
            if self.remote_cancel_state:
                observation["remote_cancel_state"] = self.remote_cancel_state
        return observation


def outcome_of(call: ToolCall, error: BaseException | None) -> ExecutionState:
    """Which execution state to report for a call that ended with `error` (or None).

    A recorded result wins over a later error (seed §6: "do not overwrite a
    verifiable success"). A write that ended without one may have taken effect:
    `unknown`, for a human or a recovery policy to settle, never `failed`. A
    state the tool declared itself wins over both.
    """
    if call.declared_state is not None:
        return call.declared_state
    if error is None or call.has_result:
        return "succeeded"
    if call.side_effect == "write":
        return "unknown"
    return "failed"


def describe_error(error: BaseException) -> str:
    if isinstance(error, Cancelled):
        return f"interrupted by stop ({error.reason})"
    return f"{type(error).__name__}: {error}"


class _ToolCallScope:
    """`with run.tool_call(...) as call:` — permit on enter, outcome report on exit.

    A context manager whose `__enter__` raises is the only way to make sure the
    body of a refused call never runs.
    """

    def __init__(self, run: AgentRun, call: ToolCall) -> None:
        self._run = run
        self._call = call

    def __enter__(self) -> ToolCall:
        if not self._call.permit:  # a call permitted already (`ask_permit(wait=False)`) goes on
            self._run.ask_permit(self._call)
        return self._call

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        self._run.report_outcome(self._call, exc)
        return False


class AgentRun:
    """A run leased by this worker. Use it as a context manager (see the module docstring)."""

    def __init__(
        self,
        client: WireClient,
        run_id: str,
        worker_id: str,
        *,
        ttl_seconds: float = 30,
        push: bool = True,
        heartbeat_interval: float | None = None,
        token: CancelToken | None = None,
        approval_poll_interval: float = APPROVAL_POLL_SECONDS,
    ) -> None:
        self.client = client
        self.run_id = run_id
        self.worker_id = worker_id
        self.ttl_seconds = ttl_seconds
        self.push = push
        self.heartbeat_interval = heartbeat_interval or ttl_seconds / 3
        self.token = token or CancelToken()
        self.lease_id: str | None = None
        self.epoch: int | None = None
        self.tool_calls: list[ToolCall] = []
        self.completed = False
        self.drained_sent = False
        self.suspended = False
        self._lock = threading.Lock()
        # Steps are per thread: parallel tool calls in worker threads each name their own step.
        self._open_steps = threading.local()
        self._heartbeat: HeartbeatLoop | None = None
        self._listener: PushListener | None = None
        self.approval_poll_interval = approval_poll_interval
        # Decisions heard on the push socket or by polling, for calls that wait.
        self.approvals = ApprovalBoard()

    # -- lease lifecycle -------------------------------------------------------------

    def __enter__(self) -> AgentRun:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self.finish()
        # A `Cancelled` that reached the top of the block is the worker obeying
        # its own stop: that is the normal way out, not an error to re-raise.
        return isinstance(exc, Cancelled) and self.token.cancelled

    def acquire(self) -> None:
        """Take the lease and start listening for stops (push and heartbeat)."""
        lease = self.client.acquire_lease(self.run_id, self.worker_id, self.ttl_seconds)
        self.lease_id = lease["lease_id"]
        self.epoch = int(lease["epoch"])
        self._listen()

    def _listen(self) -> None:
        self._heartbeat = HeartbeatLoop(
            beat=self._beat,
            interval=self.heartbeat_interval,
            ttl_seconds=self.ttl_seconds,
            on_signal=self.handle_stop_signal,
            on_lease_lost=self._lease_lost,
            name=f"safestop-heartbeat-{self.run_id}",
        )
        self._heartbeat.start()
        if self.push:
            self._listener = PushListener(
                url=self.client.push_url(self.run_id),
                bearer_token=self.client.token,
                on_signal=self.handle_stop_signal,
                on_frame=self.handle_push_frame,
                name=f"safestop-push-{self.run_id}",
            )
            self._listener.start()

    def finish(self) -> None:
        """Say `drained` if the run was stopped, else release the lease; stop listening.

        `drained` goes before the listeners stop: closing the push socket waits for the
        server's closing handshake and a heartbeat in flight, time the run's `stopped_cleanly`
        waited for. A frame or a heartbeat that comes in between finds the token set already.
        A release stops listening first, so no stop signal arrives for a lease given back.
        """
        try:
            if self.lease_id is not None and self.token.cancelled and not self.drained_sent:
                self.drained(self.default_observations())
        except (ApiError, httpx.TransportError) as error:
            # Never mask the block's own exception; the server's drain deadline
            # and lease expiry settle a worker that could not say goodbye.
            log.warning("safestop: could not finish lease on %s: %s", self.run_id, error)
        finally:
            self._stop_listening()
        if self.lease_id is None or self.token.cancelled:
            return
        try:
            self._release()
        except (ApiError, httpx.TransportError) as error:
            log.warning("safestop: could not finish lease on %s: %s", self.run_id, error)

    def _stop_listening(self) -> None:
        if self._listener is not None:
            self._listener.stop(timeout=2)
        if self._heartbeat is not None:
            self._heartbeat.stop(timeout=2)

    def release(self, *, suspend: bool = False, reason: str = "waiting_for_approval") -> None:
        """Give the lease back now; the lease block then has nothing left to finish.

        With `suspend=True` the run is suspended to wait for reviewers instead of being
        interrupted: the approvals that wait stay open, a reviewer decides them while no
        process holds the run, and the next `client.lease(...)` (any process) goes on at the
        same epoch and gets the decisions when it asks the same permits again. The server
        refuses it (`Refused`, `illegal_transition`) while a tool call is in flight. This
        object can do no more work afterwards. A stop of the suspended run still ends it.
        """
        lease_id, epoch = self._require_lease()
        self.token.raise_if_cancelled()
        self._stop_listening()
        try:
            answer = self.client.release_lease(
                self.run_id, lease_id=lease_id, epoch=epoch, suspend=suspend, reason=reason
            )
        except Refused as error:
            if error.code != "illegal_transition" or not suspend:
                raise self._refused(error) from error
            # Not suspended (a call in flight, or the run is stopping): the lease is still
            # ours, so keep listening; the stop, if that was it, reaches the token as usual.
            self._listen()
            raise
        except BaseException:
            self._listen()
            raise
        self.lease_id = None
        status = answer.get("status") if isinstance(answer, Mapping) else None
        if suspend and status and status != "suspended":
            # A stop came first: the server took the release as the drain.
            self.drained_sent = True
            self.token.cancel(reason=str(answer.get("stop_reason") or status))
            self.token.raise_if_cancelled()
        self.suspended = suspend

    def _release(self) -> None:
        assert self.lease_id is not None and self.epoch is not None
        try:
            self.client.release_lease(self.run_id, lease_id=self.lease_id, epoch=self.epoch)
        except Refused as error:
            # Completing a run may already have ended the lease: nothing left to release.
            log.info("safestop: lease on %s already gone (%s)", self.run_id, error.code)

    def _beat(self) -> Mapping[str, Any]:
        assert self.lease_id is not None and self.epoch is not None
        return self.client.heartbeat(self.run_id, lease_id=self.lease_id, epoch=self.epoch)

    def _lease_lost(self, code: str, stop_epoch: int | None) -> None:
        self.token.cancel(reason=code, stop_epoch=stop_epoch)

    def handle_stop_signal(self, signal: Mapping[str, Any]) -> bool:
        """Set the token from a pushed or heartbeat stop signal; True if it applied.

        A signal for a stop at or before this lease's epoch belongs to an
        earlier round (seed §6: "old callbacks must not change the new round"),
        so it is ignored.
        """
        stop_epoch = signal.get("stop_epoch")
        if isinstance(stop_epoch, int) and self.epoch is not None and stop_epoch <= self.epoch:
            log.info("safestop: ignoring stop signal for old epoch %s", stop_epoch)
            return False
        return self.token.cancel(
            reason=str(signal.get("reason") or "cancel_requested"),
            stop_epoch=stop_epoch if isinstance(stop_epoch, int) else None,
            requested_by=signal.get("requested_by"),
        )

    def handle_push_frame(self, frame: Mapping[str, Any]) -> None:
        """A pushed frame that is not a stop: an approval's decision is posted for its waiter."""
        decision = decision_from_frame(frame)
        if decision is not None:
            self.approvals.post(decision)

    def _refused(self, error: Refused) -> Cancelled:
        """Learn of the stop from a refusal: set the token and build the `Cancelled` to raise."""
        self.token.cancel(reason=error.code, stop_epoch=error.stop_epoch)
        return Cancelled(
            self.token.reason,
            stop_epoch=self.token.stop_epoch,
            requested_by=self.token.requested_by,
        )

    def _require_lease(self) -> tuple[str, int]:
        if self.lease_id is None or self.epoch is None:
            raise RuntimeError("the run has no lease: use `with client.lease(...) as run:`")
        return self.lease_id, self.epoch

    # -- tool calls ------------------------------------------------------------------

    def tool_call(
        self,
        tool: str,
        arguments: Any,
        side_effect: SideEffect = "none",
        *,
        tool_call_id: str | None = None,
        idempotency_key: str | None = None,
        operation_id: str | None = None,
        recovery_policy: RecoveryPolicy | None = None,
        needs_approval: bool = False,
        summary: str | None = None,
        risk: Risk | None = None,
        arguments_schema: Mapping[str, Any] | None = None,
    ) -> _ToolCallScope:
        """Guard one tool call: permit before, outcome after (see `outcome_of`).

        If the server's rules (or `needs_approval=True`) put the call before a
        reviewer, entering the block waits for the decision: the body then runs
        with `call.arguments` as approved (possibly edited), or never runs and
        `ApprovalRejected` carries the reviewer's message. `summary`, `risk`
        and `arguments_schema` (JSON Schema that edits must satisfy) are shown
        to the reviewer.
        """
        return _ToolCallScope(
            self,
            self.new_tool_call(
                tool,
                arguments,
                side_effect,
                tool_call_id=tool_call_id,
                idempotency_key=idempotency_key,
                operation_id=operation_id,
                recovery_policy=recovery_policy,
                needs_approval=needs_approval,
                summary=summary,
                risk=risk,
                arguments_schema=arguments_schema,
            ),
        )

    def new_tool_call(
        self,
        tool: str,
        arguments: Any,
        side_effect: SideEffect = "none",
        *,
        tool_call_id: str | None = None,
        idempotency_key: str | None = None,
        operation_id: str | None = None,
        recovery_policy: RecoveryPolicy | None = None,
        step_key: str | None = None,
        needs_approval: bool = False,
        summary: str | None = None,
        risk: Risk | None = None,
        arguments_schema: Mapping[str, Any] | None = None,
    ) -> ToolCall:
        """The call `tool_call(...)` guards, not asked for yet: for adapters that ask in two steps.

        `ask_permit(call, wait=False)` asks without waiting for an approval;
        `guard(call)` then runs the body under the same rules as `tool_call`.
        """
        return ToolCall(
            tool=tool,
            arguments=arguments,
            side_effect=side_effect,
            tool_call_id=tool_call_id or f"call_{uuid.uuid4().hex}",
            idempotency_key=idempotency_key,
            operation_id=operation_id,
            recovery_policy=recovery_policy,
            step_key=step_key or self.current_step_key(),
            needs_approval=needs_approval,
            summary=summary,
            risk=risk,
            arguments_schema=arguments_schema,
        )

    def guard(self, call: ToolCall) -> _ToolCallScope:
        """`with run.guard(call) as call:` — `tool_call(...)` for a call made by `new_tool_call`.

        Asks the permit on entry unless the call already has one; reports the outcome on exit.
        """
        return _ToolCallScope(self, call)

    def ask_permit(self, call: ToolCall, *, wait: bool = True) -> bool:
        """Ask the server's permission to start `call`; raise `Cancelled` if refused.

        The server grants permits under the same lock that records a stop, so
        a granted permit means the call started before any stop (seed §4). An
        answer without a `permit_id` is "not yet": the call waits for its
        approval (`ApprovalRejected` if it is not given) or, with nothing to
        wait for, fails closed with `NoPermit`.

        With `wait=False` a call that must wait for a reviewer is not waited
        for: `call.approval` names the approval and False is returned (True
        when the permit was granted). Ask again with the same `tool_call_id`
        once the approval is decided: the server answers the permit with the
        final arguments, or `ApprovalRejected`. Frameworks that suspend work
        themselves (LangGraph's `interrupt()`) wait that way, holding no thread.
        """
        _, epoch = self._require_lease()
        # A call still queued when the stop arrived never starts (seed §6, first row).
        self.token.raise_if_cancelled()
        try:
            answer: Mapping[str, Any] = retry(
                lambda: self.client.send_permit_request(self.run_id, call, epoch=epoch),
                token=self.token,
                attempts=3,
                base_delay=FACT_BASE_DELAY,
                retry_if=_is_network_error,
            )
            if not answer.get("permit_id") and not wait:
                approval = answer.get("approval")
                if not isinstance(approval, Mapping) or not approval.get("id"):
                    raise NoPermit(answer)
                call.approval = dict(approval)
                return False
            if not answer.get("permit_id"):
                answer = self._wait_for_permit(call, answer)
            elif isinstance(answer.get("approval"), Mapping) and "arguments" in answer:
                # A permit asked again after its approval carries the approved arguments.
                call.approval = dict(answer["approval"])
                call.arguments = answer["arguments"]
            # The last moment a stop can still keep the body from running.
            self.token.raise_if_cancelled()
        except Refused as error:
            raise self._refused(error) from error
        except ToolCallConflict:
            # The id names another call, which may be running or done: reporting `not_started`
            # on it would overwrite that call's record. Nothing was granted to this one.
            raise
        except ApiError as error:
            closed = _closed_approval(error)
            if closed is None:
                self._report_not_started(call)
                raise
            # Asked again after a rejection, expiry or void: the server settled the call.
            raise closed from error
        except ApprovalRejected:
            # The server settled the call when it was rejected, expired or voided.
            raise
        except Exception:
            # No answer (network, or a stop during the retry backoff or the
            # approval wait), or no permit id: the permit may exist server-side,
            # but the call certainly never started.
            self._report_not_started(call)
            raise
        call.permit = answer
        with self._lock:
            self.tool_calls.append(call)
        return True

    def _wait_for_permit(self, call: ToolCall, answer: Mapping[str, Any]) -> PermitInfo:
        """Wait for the approval a 202 names; the approved permit, or raise (see `ask_permit`)."""
        approval = answer.get("approval")
        approval_id = approval.get("id") if isinstance(approval, Mapping) else None
        if not isinstance(approval, Mapping) or not approval_id:
            raise NoPermit(answer)
        call.approval = dict(approval)
        decision = self.wait_for_approval(
            str(approval_id), poll_now=approval.get("status") not in (None, "waiting")
        )
        call.decision = decision
        call.approval = {**call.approval, **decision.source, "status": decision.status}
        if decision.status == "void":
            self.raise_if_void_stopped()
        if not decision.approved:
            raise ApprovalRejected(decision.message, decision.status, call.approval)
        permit_id, arguments = decision.permit_id, decision.arguments
        if permit_id is None or arguments is NOT_GIVEN:
            # The decision did not carry everything: the approval itself does.
            current = self._get_approval(str(approval_id))
            permit_id = permit_id or current.get("permit_id")
            if arguments is NOT_GIVEN:
                arguments = current.get("arguments", NOT_GIVEN)
        if not permit_id:
            raise NoPermit(call.approval)
        if arguments is not NOT_GIVEN:
            call.arguments = arguments
        epoch = answer.get("epoch")
        return {
            "permit_id": str(permit_id),
            "tool_call_id": call.tool_call_id,
            "epoch": epoch if isinstance(epoch, int) else self._require_lease()[1],
            "approval": dict(call.approval),  # type: ignore[typeddict-item]
        }

    def wait_for_approval(
        self, approval_id: str, *, timeout: float | None = None, poll_now: bool = False
    ) -> ApprovalDecision:
        """Block until approval `approval_id` is decided; return the decision.

        The decision comes from the push socket at once, or from polling the
        approval's GET every `approval_poll_interval` seconds (at once if
        `poll_now`). A stop ends the wait with `Cancelled` (the server voids
        the approval). `timeout` (seconds) raises `TimeoutError`; by default
        the wait lasts until the server decides, which its deadline bounds.

        Tool calls wait by themselves; call this for an outbox item answered
        `awaiting_approval` (`item["approval"]["id"]`) when the agent should
        know the outcome before going on. It never raises for a rejection:
        look at `decision.status` and `decision.message`.
        """
        started = time.monotonic()
        next_poll = started if poll_now else started + self.approval_poll_interval
        wake = threading.Event()
        forget_post = self.approvals.on_post(wake.set)
        forget_cancel = self.token.on_cancel(wake.set)
        try:
            while True:
                wake.clear()
                self.token.raise_if_cancelled()
                decision = self.approvals.get(approval_id)
                if decision is not None:
                    return decision
                now = time.monotonic()
                if now >= next_poll:
                    polled = self._poll_approval(approval_id)
                    if polled is not None:
                        self.approvals.post(polled)
                        continue
                    next_poll = now + self.approval_poll_interval
                wake_at = next_poll
                if timeout is not None:
                    if now - started >= timeout:
                        raise TimeoutError(f"approval {approval_id} still waiting after {timeout}s")
                    wake_at = min(wake_at, started + timeout)
                wake.wait(max(0.0, wake_at - now))
        finally:
            forget_post()
            forget_cancel()

    def raise_if_void_stopped(self) -> None:
        """After an approval came back `void`: raise `Cancelled` if a stop voided it.

        The server voids the approvals that wait when it stops the run (or hands
        it over, or the lease is lost), and its `approval.decided` frame may
        reach us before the stop signal. So a void is never taken as a mere
        decision: wait a moment for the signal, and if none came, ask the run's
        status; a run no longer open for work counts as stopped.
        """
        if not self.token.wait(VOID_GRACE_SECONDS):
            try:
                status = str(self.client.get_run(self.run_id).get("status") or "")
            except (ApiError, httpx.TransportError) as error:
                log.info("safestop: run status not read after a void: %r", error)
                status = ""
            if status and status not in OPEN_STATUSES:
                self.token.cancel(reason=status)
        self.token.raise_if_cancelled()

    def _poll_approval(self, approval_id: str) -> ApprovalDecision | None:
        """The approval's decision if it has one; None while it waits or the server is unreachable."""
        try:
            return decision_from_approval(self.client.get_approval(approval_id))
        except Refused as error:
            raise self._refused(error) from error
        except (ApiError, httpx.TransportError) as error:
            if not _is_network_error(error):
                raise
            log.info("safestop: approval %s not polled: %r", approval_id, error)
            return None

    def _get_approval(self, approval_id: str) -> Mapping[str, Any]:
        try:
            return retry(
                lambda: self.client.get_approval(approval_id),
                token=self.token,
                attempts=3,
                base_delay=FACT_BASE_DELAY,
                retry_if=_is_network_error,
            )
        except Refused as error:
            raise self._refused(error) from error

    def _report_not_started(self, call: ToolCall) -> None:
        try:
            self.client.report_tool_result(
                self.run_id, call.tool_call_id, execution_state="not_started"
            )
            call.execution_state = "not_started"
            call.reported = True
        except (ApiError, httpx.TransportError):
            log.info("safestop: no permit record for %s to mark not_started", call.tool_call_id)

    def report_outcome(self, call: ToolCall, error: BaseException | None) -> None:
        """Report the call's execution state; retried, and sent even after a stop."""
        state = outcome_of(call, error)
        observation = call.last_observation
        if error is not None and not call.has_result:
            note = describe_error(error)
            observation = f"{observation}\n[{note}]" if observation else note
        elif observation is None and call.has_result:
            observation = _short_text(call.result)
        call.execution_state = state
        try:
            retry(
                lambda: self.client.report_tool_result(
                    self.run_id,
                    call.tool_call_id,
                    execution_state=state,
                    operation_id=call.operation_id,
                    observation=observation,
                    output_truncated=call.output_truncated,
                    remote_cancel_state=call.remote_cancel_state,
                ),
                token=None,
                attempts=FACT_ATTEMPTS,
                base_delay=FACT_BASE_DELAY,
                retry_if=_is_network_error,
            )
            call.reported = True
        except (ApiError, httpx.TransportError) as report_error:
            # Not raised: the tool's own outcome matters more than the report.
            # The server's reaper turns an unreported call into `unknown`, and the
            # drain observations list it as unreported.
            log.error("safestop: result of %s not reported: %s", call.tool_call_id, report_error)

    # -- events ----------------------------------------------------------------------

    def event(self, type: str, *, event_id: str | None = None, **fields: Any) -> EventAnswer:
        """Send one event at this lease's epoch; return its answer.

        `event_id` defaults to a fresh one; give your own to make a repeat of the same fact
        (another process reporting it again) a `duplicate` rather than a second event.
        """
        _, epoch = self._require_lease()
        event = {"event_id": event_id or f"evt_{uuid.uuid4().hex}", "type": type, **fields}
        try:
            answer = retry(
                lambda: self.client.send_events(self.run_id, epoch=epoch, events=[event]),
                token=None,
                attempts=FACT_ATTEMPTS,
                base_delay=FACT_BASE_DELAY,
                retry_if=_is_network_error,
            )
        except Refused as error:
            raise self._refused(error) from error
        return _answer_for(answer, event["event_id"])

    @contextmanager
    def step(self, key: str, name: str, kind: StepKind = "tool_read") -> Iterator[None]:
        """Report step.started, run the body, then step.completed or step.failed.

        A refused `step.started` means the run was stopped: the body never runs.
        """
        self.token.raise_if_cancelled()
        started = self.event("step.started", key=key, name=name, kind=kind)
        if started.get("status") == "rejected" and started.get("code") in REFUSAL_CODES:
            raise self._refused(
                Refused(409, str(started.get("code")), "step.started rejected", started)
            )
        stack = self._step_stack()
        stack.append(key)
        try:
            yield
        except BaseException as error:
            self._report_step_failed(key, error)
            raise
        finally:
            stack.pop()
        self.event("step.completed", key=key)

    def _step_stack(self) -> list[str]:
        if not hasattr(self._open_steps, "keys"):
            self._open_steps.keys = []
        stack: list[str] = self._open_steps.keys
        return stack

    def current_step_key(self) -> str | None:
        """The innermost step open in this thread: the step a tool call belongs to."""
        stack = self._step_stack()
        return stack[-1] if stack else None

    def _report_step_failed(self, key: str, error: BaseException) -> None:
        try:
            self.event(
                "step.failed",
                key=key,
                error=describe_error(error),
                cancelled=isinstance(error, Cancelled),
            )
        except (ApiError, httpx.TransportError, Cancelled) as report_error:
            log.warning("safestop: step.failed for %s not reported: %s", key, report_error)

    def checkpoint(
        self, label: str, state: Mapping[str, Any], *, step_seq: int | None = None
    ) -> EventAnswer:
        """Save a resume point (`checkpoint_04`); the stop packet names the latest as `resume_from`."""
        fields: dict[str, Any] = {"label": label, "state": dict(state)}
        if step_seq is not None:
            fields["step_seq"] = step_seq
        return self.event("checkpoint.saved", **fields)

    def artifact(
        self,
        name: str,
        *,
        kind: str = "",
        uri: str | None = None,
        content: str | None = None,
        checksum: str | None = None,
        reusable: bool = False,
        evidence: bool = False,
        step_key: str | None = None,
    ) -> EventAnswer:
        """Record something the run produced, so a human taking over can reuse it or cite it."""
        if checksum is None and content is not None:
            checksum = "sha256:" + hashlib.sha256(content.encode("utf-8")).hexdigest()
        fields: dict[str, Any] = {
            "name": name,
            "kind": kind,
            "reusable": reusable,
            "evidence": evidence,
        }
        optional = {"uri": uri, "content": content, "checksum": checksum, "step_key": step_key}
        fields.update({k: v for k, v in optional.items() if v is not None})
        return self.event("artifact.added", **fields)

    def report_usage(
        self,
        *,
        model: str,
        input_tokens: int,
        output_tokens: int,
        provider: str | None = None,
        cache_read_tokens: int | None = None,
        cache_write_tokens: int | None = None,
        cost_usd: float | Decimal | None = None,
        step_key: str | None = None,
        event_id: str | None = None,
    ) -> EventAnswer:
        """Report one model call's tokens (`cost_usd` only if the provider said what it cost).

        The server prices the call and counts it against the run's cost and token budgets;
        reaching one stops the run. `step_key` defaults to the step open in this thread.
        `event_id` (e.g. derived from the provider's response id) makes a repeated report
        of the same call a `duplicate`, counted once.
        """
        return self.event(
            "usage",
            event_id=event_id,
            **usage_fields(
                model=model,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                provider=provider,
                cache_read_tokens=cache_read_tokens,
                cache_write_tokens=cache_write_tokens,
                cost_usd=cost_usd,
                step_key=step_key or self.current_step_key(),
            ),
        )

    def steering_applied(self, message_id: int | str) -> EventAnswer:
        """Say steering message `message_id` (the `id` that `steer()` answered) was applied.

        The wire field is `steering_id`, an integer (DESIGN §5 events).
        """
        return self.event("steering.applied", steering_id=int(message_id))

    def suspend(self, reason: str) -> EventAnswer:
        return self.event("run.suspended", reason=reason)

    def complete(self, result: Any = None) -> EventAnswer:
        """Report the run finished. After a stop the server keeps it as a late fact only."""
        answer = self.event("run.completed", result=result)
        self.completed = answer.get("status") in ("accepted", "duplicate")
        return answer

    def fail(self, error: str) -> EventAnswer:
        return self.event("run.failed", error=error)

    # -- outbox and drain ------------------------------------------------------------

    def enqueue_outbox(
        self,
        transport: str,
        destination: str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        needs_approval: bool = False,
        summary: str | None = None,
        risk: Risk | None = None,
    ) -> OutboxItemInfo:
        """Hand a side effect to the server to dispatch; refused (→ `Cancelled`) after a stop.

        The answer is returned as the server gave it. An item a reviewer must
        approve first (a team rule, or `needs_approval=True`) answers
        `{"status": "awaiting_approval", "approval": {...}}`: the server
        dispatches it once approved and never otherwise. To know the outcome
        before going on, `run.wait_for_approval(item["approval"]["id"])`.
        """
        _, epoch = self._require_lease()
        self.token.raise_if_cancelled()
        key = idempotency_key or f"outbox_{uuid.uuid4().hex}"
        try:
            return retry(
                lambda: self.client.enqueue_outbox(
                    self.run_id,
                    epoch=epoch,
                    transport=transport,
                    destination=destination,
                    payload=payload,
                    idempotency_key=key,
                    needs_approval=needs_approval,
                    summary=summary,
                    risk=risk,
                ),
                token=self.token,
                attempts=3,
                base_delay=FACT_BASE_DELAY,
                retry_if=_is_network_error,
            )
        except Refused as error:
            raise self._refused(error) from error

    def default_observations(self) -> list[dict[str, Any]]:
        """What the worker knows at drain time: every call it made under this lease."""
        with self._lock:
            calls = list(self.tool_calls)
        observations: list[dict[str, Any]] = [
            {"kind": "stop_seen", "reason": self.token.reason, "stop_epoch": self.token.stop_epoch}
        ]
        observations.extend(call.drain_observation() for call in calls)
        return observations

    def drained(self, observations: list[Any] | None = None) -> Mapping[str, Any]:
        """Tell the server this worker has stopped all work for the run."""
        lease_id, epoch = self._require_lease()
        answer = retry(
            lambda: self.client.drained(
                self.run_id,
                lease_id=lease_id,
                epoch=epoch,
                observations=observations
                if observations is not None
                else self.default_observations(),
                stop_epoch=self.token.stop_epoch,
            ),
            token=None,
            attempts=FACT_ATTEMPTS,
            base_delay=FACT_BASE_DELAY,
            retry_if=_is_network_error,
        )
        self.drained_sent = True
        return answer or {}


def _closed_approval(error: ApiError) -> ApprovalRejected | None:
    """A 409 `approval_closed` (a permit asked again once its approval ended) as the rejection."""
    if error.status_code != 409 or error.code != "approval_closed":
        return None
    approval = error.body.get("approval") if isinstance(error.body, Mapping) else None
    approval = approval if isinstance(approval, Mapping) else {}
    status = str(approval.get("status") or "rejected")
    return ApprovalRejected(str(approval.get("message") or ""), status, approval)


def _answer_for(answer: Any, event_id: str) -> EventAnswer:
    """Find one event's answer in a batch answer (a list, or {"results"/"events": [...]})."""
    entries: Any = answer
    if isinstance(answer, Mapping):
        entries = answer.get("results") or answer.get("events") or []
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, Mapping) and entry.get("event_id") == event_id:
                return dict(entry)  # type: ignore[return-value]
        if len(entries) == 1 and isinstance(entries[0], Mapping):
            return dict(entries[0])  # type: ignore[return-value]
    return {"event_id": event_id}


def _short_text(value: Any, limit: int = 2000) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
