"""The safestop wire contract (DESIGN §5) as typed answers and one HTTP client.

`WireClient` has one method per endpoint, keyword arguments named after the JSON fields. Answers
are returned as the decoded JSON (typed with the TypedDicts below; the server
may add fields). Non-2xx answers raise `ApiError`; the 409 refusals that mean
"stopped / stale / revoked" raise its subclass `Refused`. Network failures are
left as `httpx.TransportError` so callers can tell "no answer" from "no".

This module knows nothing of workers: `worker.py` builds on it, and
`client.SafestopClient` adds `lease()` on top of both, so imports point one way
(wire ← worker ← client).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, Self, TypedDict
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import httpx

from ._version import USER_AGENT, VERSION_HEADER, __version__
from .errors import (
    REFUSAL_CODES,
    ApiError,
    ClientDisconnected,
    ClientTooOld,
    Refused,
    ToolCallConflict,
)

SideEffect = Literal["none", "write"]
ExecutionState = Literal["running", "succeeded", "failed", "not_started", "unknown"]
RemoteCancelState = Literal["not_requested", "requested", "confirmed", "refused"]
RecoveryPolicy = Literal[
    "query_original", "reuse_idempotency_key", "manual_confirmation", "compensate"
]
StopReason = Literal[
    "user_stop",
    "manual_takeover",
    "budget_exhausted",
    "timeout",
    "admin_kill",
    "dependency_failure",
    "lease_expired",
    "drain_deadline",
]
Decision = Literal["applied", "not_applied", "compensated"]
Risk = Literal["low", "medium", "high"]
ApprovalStatus = Literal["waiting", "approved", "rejected", "expired", "void"]
ReviewDecision = Literal["approve", "reject"]


class RunInfo(TypedDict, total=False):
    id: str
    title: str
    agent: str
    status: str
    stop_epoch: int
    stop_reason: str | None
    resume_from: str | None
    result: Any  # what `run.complete(...)` was given (the run's detail only)
    failure: Any  # what `run.fail(...)` was given (the run's detail only)


class LeaseInfo(TypedDict):
    lease_id: str
    epoch: int
    expires_at: str


class StopSignal(TypedDict):
    type: Literal["cancel_requested"]
    reason: str
    requested_by: str
    stop_epoch: int


class HeartbeatAnswer(TypedDict):
    expires_at: str
    signal: StopSignal | None


class ApprovalRef(TypedDict, total=False):
    """The approval a permit or an outbox item waits for (DESIGN §10)."""

    id: str
    status: ApprovalStatus
    deadline: str
    rule: Any


class PermitInfo(TypedDict):
    """A permit (201), or a 202 that waits for `approval` and has no `permit_id` yet.

    Never start a call without a `permit_id`.
    """

    permit_id: NotRequired[str]
    tool_call_id: str
    epoch: int
    approval: NotRequired[ApprovalRef]


class OutboxItemInfo(TypedDict):
    """An outbox item; `status` is `awaiting_approval` (with `approval`) while a reviewer decides."""

    id: str
    status: str
    idempotency_key: NotRequired[str]
    approval: NotRequired[ApprovalRef]


class ApprovalInfo(TypedDict, total=False):
    """`GET /api/v1/approvals/{id}/`: `arguments` are the final ones (edited or the originals).
    In a list (`iter_approvals`) the arguments are summarised instead: `arguments_summary`,
    `arguments_chars`, `arguments_truncated`, `has_arguments_schema`."""

    id: str
    run_id: str
    epoch: int
    target: Literal["tool_call", "outbox"]
    tool_call_id: str | None
    outbox_id: str | None
    tool: str
    status: ApprovalStatus
    rule: Any
    summary: str
    risk: str
    original_arguments: Any
    arguments: Any
    message: str
    decided_by: str | None
    decided_at: str | None
    requested_at: str
    deadline: str | None
    permit_id: str | None
    arguments_summary: str
    arguments_chars: int
    arguments_truncated: bool
    has_arguments_schema: bool


class StopRequestInfo(TypedDict):
    id: str
    reason: str
    requested_by: str
    requested_at: str


class StopAnswer(TypedDict):
    status: str
    stop_epoch: int
    stop_request: StopRequestInfo


class EventAnswer(TypedDict, total=False):
    event_id: str
    status: Literal["accepted", "duplicate", "rejected"]
    code: str


JSON = dict[str, Any]


@dataclass
class PermitAsk:
    """One tool call's permit request as the wire sends it (the run and the epoch aside):
    `WireClient.request_permit`'s keywords. A worker's `ToolCall` is one, with what it learns
    as the call goes (its `arguments` become the approved ones)."""

    tool: str
    arguments: Any
    side_effect: SideEffect
    tool_call_id: str
    idempotency_key: str | None = None
    operation_id: str | None = None
    recovery_policy: RecoveryPolicy | None = None
    step_key: str | None = None
    needs_approval: bool = False
    summary: str | None = None
    risk: Risk | None = None
    arguments_schema: Mapping[str, Any] | None = None

    def body(self, epoch: int) -> JSON:
        body: JSON = {
            "epoch": epoch,
            "tool_call_id": self.tool_call_id,
            "tool": self.tool,
            "side_effect": self.side_effect,
            "arguments": self.arguments,
        }
        body.update(
            _present(
                idempotency_key=self.idempotency_key,
                operation_id=self.operation_id,
                recovery_policy=self.recovery_policy,
                step_key=self.step_key,
                **_approval_fields(
                    self.needs_approval, self.summary, self.risk, self.arguments_schema
                ),
            )
        )
        return body


class WireClient:
    """Talks to one safestop server with one bearer token (use `SafestopClient`).

    The underlying `httpx.Client` is shared by the worker's heartbeat thread and
    the agent's own thread; httpx's connection pool is safe for that.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                # Which wire contract this client speaks: a server that needs a newer one
                # answers `426 client_too_old` (`ClientTooOld`) rather than being misunderstood.
                "User-Agent": f"{USER_AGENT} httpx/{httpx.__version__}",
                VERSION_HEADER: __version__,
            },
            timeout=timeout,
            transport=transport,
        )

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.disconnect()

    def disconnect(self) -> None:
        """Close the HTTP connection pool. (`close()` is the reviewer's close-the-run action.)"""
        self._http.close()

    # -- runs ----------------------------------------------------------------------

    def create_run(
        self,
        title: str,
        agent: str,
        *,
        steps: Sequence[Mapping[str, Any]] | None = None,
        budget: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> RunInfo:
        """Create a run. Pass `idempotency_key` to make a retried create return the first run."""
        body: JSON = {"title": title, "agent": agent}
        if idempotency_key:
            body["idempotency_key"] = idempotency_key
        if steps is not None:
            body["steps"] = list(steps)
        if budget is not None:
            body["budget"] = dict(budget)
        return self._request("POST", "/api/v1/runs/", json=body)

    def get_run(self, run_id: str) -> RunInfo:
        return self._request("GET", _run_path(run_id))

    def list_runs(
        self, *, status: str | None = None, page_size: int | None = None
    ) -> list[RunInfo]:
        """Every run the token's team can see (newest first), all pages of them."""
        return list(self.iter_runs(status=status, page_size=page_size))

    def iter_runs(
        self, *, status: str | None = None, page_size: int | None = None
    ) -> Iterator[RunInfo]:
        """The runs page by page, asking for the next page only when it is needed."""
        return self._pages("/api/v1/runs/", _present(status=status, limit=page_size))

    # -- lease ---------------------------------------------------------------------

    def acquire_lease(self, run_id: str, worker_id: str, ttl_seconds: float = 30) -> LeaseInfo:
        body = {"worker_id": worker_id, "ttl_seconds": ttl_seconds}
        return self._request("POST", _run_path(run_id, "lease/"), json=body)

    def heartbeat(self, run_id: str, *, lease_id: str, epoch: int) -> HeartbeatAnswer:
        body = {"lease_id": lease_id, "epoch": epoch}
        return self._request("POST", _run_path(run_id, "lease/heartbeat/"), json=body)

    def release_lease(
        self,
        run_id: str,
        *,
        lease_id: str,
        epoch: int,
        suspend: bool = False,
        reason: str | None = None,
    ) -> JSON:
        """Give the lease back. `suspend=True`: the run is suspended to wait for reviewers (its
        waiting approvals stay open; the next lease goes on at the same epoch), not interrupted."""
        body: dict[str, Any] = {"lease_id": lease_id, "epoch": epoch}
        if suspend:
            body["suspend"] = True
            if reason:
                body["reason"] = reason
        return self._request("POST", _run_path(run_id, "lease/release/"), json=body)

    # -- work ----------------------------------------------------------------------

    def request_permit(
        self,
        run_id: str,
        *,
        epoch: int,
        tool_call_id: str,
        tool: str,
        side_effect: SideEffect,
        arguments: Any,
        idempotency_key: str | None = None,
        operation_id: str | None = None,
        recovery_policy: RecoveryPolicy | None = None,
        step_key: str | None = None,
        needs_approval: bool = False,
        summary: str | None = None,
        risk: Risk | None = None,
        arguments_schema: Mapping[str, Any] | None = None,
    ) -> PermitInfo:
        """Ask to start one tool call. The answer may wait for an approval: see `PermitInfo`."""
        ask = PermitAsk(
            tool_call_id=tool_call_id,
            tool=tool,
            side_effect=side_effect,
            arguments=arguments,
            idempotency_key=idempotency_key,
            operation_id=operation_id,
            recovery_policy=recovery_policy,
            step_key=step_key,
            needs_approval=needs_approval,
            summary=summary,
            risk=risk,
            arguments_schema=arguments_schema,
        )
        return self.send_permit_request(run_id, ask, epoch=epoch)

    def send_permit_request(self, run_id: str, ask: PermitAsk, *, epoch: int) -> PermitInfo:
        """`request_permit` with its fields as one `PermitAsk`."""
        return self._request("POST", _run_path(run_id, "permits/"), json=ask.body(epoch))

    def report_tool_result(
        self,
        run_id: str,
        tool_call_id: str,
        *,
        execution_state: ExecutionState,
        operation_id: str | None = None,
        observation: str | None = None,
        output_truncated: bool = False,
        remote_cancel_state: RemoteCancelState | None = None,
    ) -> JSON:
        body: JSON = {"execution_state": execution_state, "output_truncated": output_truncated}
        body.update(
            _present(
                operation_id=operation_id,
                observation=observation,
                remote_cancel_state=remote_cancel_state,
            )
        )
        path = _run_path(run_id, f"tool-calls/{quote(tool_call_id, safe='')}/result/")
        return self._request("POST", path, json=body)

    def send_events(self, run_id: str, *, epoch: int, events: Sequence[Mapping[str, Any]]) -> JSON:
        """Send a batch; the answer has one entry per event: accepted, duplicate or rejected."""
        body = {"epoch": epoch, "events": [dict(event) for event in events]}
        return self._request("POST", _run_path(run_id, "events/"), json=body)

    def enqueue_outbox(
        self,
        run_id: str,
        *,
        epoch: int,
        transport: str,
        destination: str,
        payload: Any,
        idempotency_key: str,
        needs_approval: bool = False,
        summary: str | None = None,
        risk: Risk | None = None,
        arguments_schema: Mapping[str, Any] | None = None,
    ) -> OutboxItemInfo:
        """Hand a side effect to the server; it may wait in `awaiting_approval` first."""
        body: JSON = {
            "epoch": epoch,
            "transport": transport,
            "destination": destination,
            "payload": payload,
            "idempotency_key": idempotency_key,
        }
        body.update(_present(**_approval_fields(needs_approval, summary, risk, arguments_schema)))
        return self._request("POST", _run_path(run_id, "outbox/"), json=body)

    def drained(
        self,
        run_id: str,
        *,
        lease_id: str,
        epoch: int,
        observations: Sequence[Any] = (),
        stop_epoch: int | None = None,
    ) -> JSON:
        """The worker says it stopped; `epoch` is the lease's epoch, not the new stop epoch."""
        body: JSON = {"lease_id": lease_id, "epoch": epoch, "observations": list(observations)}
        body.update(_present(stop_epoch=stop_epoch))
        return self._request("POST", _run_path(run_id, "drained/"), json=body)

    # -- reviewer actions ----------------------------------------------------------

    def cancel(
        self, run_id: str, reason: StopReason | str = "user_stop", note: str = ""
    ) -> StopAnswer:
        """Stop the run. Repeating it answers with the same stop request."""
        body = {"reason": reason, "note": note}
        return self._request("POST", _run_path(run_id, "cancel/"), json=body)

    def takeover(self, run_id: str, note: str = "") -> JSON:
        return self._request("POST", _run_path(run_id, "takeover/"), json={"note": note})

    def resume(self, run_id: str, note: str = "", **fields: Any) -> JSON:
        return self._request("POST", _run_path(run_id, "resume/"), json={"note": note, **fields})

    def close(self, run_id: str, note: str = "") -> JSON:
        """Close a stopped or handed-off run for good (`cancelled`)."""
        return self._request("POST", _run_path(run_id, "close/"), json={"note": note})

    def stop_packet(self, run_id: str, epoch: int | None = None) -> JSON:
        """The latest stop packet, or the one for an older stop `epoch`."""
        suffix = "stop-packet/" if epoch is None else f"stop-packets/{int(epoch)}/"
        return self._request("GET", _run_path(run_id, suffix))

    def resolve(
        self,
        run_id: str,
        *,
        target: Literal["tool_call", "outbox"],
        id: str,
        decision: Decision,
        evidence: str = "",
    ) -> JSON:
        body = {"target": target, "id": id, "decision": decision, "evidence": evidence}
        return self._request("POST", _run_path(run_id, "resolutions/"), json=body)

    def steer(self, run_id: str, text: str) -> JSON:
        return self._request("POST", _run_path(run_id, "steering/"), json={"text": text})

    # -- approvals (DESIGN §10) -----------------------------------------------------

    def get_approval(self, approval_id: str) -> ApprovalInfo:
        """One approval; an agent token may read its own runs' approvals."""
        return self._request("GET", _approval_path(approval_id))

    def iter_approvals(
        self,
        *,
        status: ApprovalStatus | None = None,
        run: str | None = None,
        agent: str | None = None,
    ) -> Iterator[ApprovalInfo]:
        """Reviewers: the team's approvals, every page of them."""
        return self._pages("/api/v1/approvals/", _present(status=status, run=run, agent=agent))

    def list_approvals(
        self,
        *,
        status: ApprovalStatus | None = None,
        run: str | None = None,
        agent: str | None = None,
    ) -> list[ApprovalInfo]:
        return list(self.iter_approvals(status=status, run=run, agent=agent))

    def decide_approval(
        self,
        approval_id: str,
        decision: ReviewDecision,
        *,
        message: str = "",
        arguments: Any = None,
    ) -> ApprovalInfo:
        """Reviewers: approve (with edited `arguments` if given) or reject with a `message`.

        409 `already_decided` / `approval_void` / `stale_epoch` raise `ApiError`.
        """
        body: JSON = {"decision": decision, "message": message}
        if arguments is not None:
            body["arguments"] = arguments
        return self._request("POST", _approval_path(approval_id, "decide/"), json=body)

    # -- audit ---------------------------------------------------------------------

    def ledger(self, **filters: str) -> Any:
        """One page of audit entries: `{"next", "previous", "results"}` (see `iter_ledger`)."""
        return self._request("GET", "/api/v1/ledger/", params=filters or None)

    def iter_ledger(self, **filters: str) -> Iterator[JSON]:
        """Every audit entry matching `filters`, following the pages."""
        return self._pages("/api/v1/ledger/", filters)

    def stop_quality(self) -> JSON:
        return self._request("GET", "/api/v1/metrics/stop-quality/")

    # -- push channel --------------------------------------------------------------

    def push_url(self, run_id: str) -> str:
        """The websocket address where the server pushes stop signals for this run."""
        parts = urlsplit(self.base_url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        path = f"{parts.path.rstrip('/')}/ws/agent/runs/{quote(run_id, safe='')}/"
        return urlunsplit((scheme, parts.netloc, path, "", ""))

    # -- plumbing ------------------------------------------------------------------

    def _pages(self, path: str, params: Mapping[str, Any]) -> Iterator[Any]:
        """Items of a cursor-paginated list: `{"next", "previous", "results"}` pages.

        Only the `cursor` is taken from `next`: the rest of that address is
        the server's view of itself (host, scheme, prefix), which a proxy may
        rewrite, so the next page is asked at our own base URL. A bare list
        answer is one page.
        """
        query = dict(params)
        seen: set[str] = set()
        while True:
            answer = self._request("GET", path, params=query or None)
            if not isinstance(answer, Mapping):
                yield from answer or ()
                return
            yield from answer.get("results") or ()
            next_url = answer.get("next")
            if not next_url:
                return
            cursor = _cursor_of(next_url)
            if cursor is None or cursor in seen:
                # Never end quietly with pages left unread: that is the bug this replaced.
                raise ApiError(200, "bad_page", f"{path}: unusable next page {next_url!r}", answer)
            seen.add(cursor)
            query["cursor"] = cursor

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            response = self._http.request(method, path, json=json, params=params)
        except RuntimeError as error:  # httpx refuses a request on a closed client this way
            if self._http.is_closed:
                raise ClientDisconnected(
                    f"{method} {path}: this client was disconnected"
                ) from error
            raise
        if response.is_success:
            return _decode_json(response)
        raise error_from_response(response)


def error_from_response(response: httpx.Response) -> ApiError:
    """Turn an error answer into `Refused` (409 stop/stale/revoked) or `ApiError`."""
    body = _decode_json(response)
    if isinstance(body, dict):
        code = str(body.get("error") or f"http_{response.status_code}")
        detail = str(body.get("detail") or "")
    else:
        code = f"http_{response.status_code}"
        detail = response.text[:500]
    if response.status_code == 409 and code in REFUSAL_CODES:
        return Refused(response.status_code, code, detail, body)
    if response.status_code == 409 and code == ToolCallConflict.CODE:
        return ToolCallConflict(response.status_code, code, detail, body)
    if code == ClientTooOld.CODE:
        return ClientTooOld(response.status_code, code, detail, body)
    return ApiError(response.status_code, code, detail, body)


def _decode_json(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _cursor_of(next_url: Any) -> str | None:
    if not isinstance(next_url, str):
        return None
    cursors = parse_qs(urlsplit(next_url).query).get("cursor")
    return cursors[0] if cursors else None


def _run_path(run_id: str, suffix: str = "") -> str:
    return f"/api/v1/runs/{quote(run_id, safe='')}/{suffix}"


def _approval_path(approval_id: str, suffix: str = "") -> str:
    return f"/api/v1/approvals/{quote(approval_id, safe='')}/{suffix}"


def _approval_fields(
    needs_approval: bool,
    summary: str | None,
    risk: str | None,
    arguments_schema: Mapping[str, Any] | None,
) -> JSON:
    """The optional approval request fields, `None` where not given (dropped by `_present`)."""
    return {
        "needs_approval": True if needs_approval else None,
        "summary": summary,
        "risk": risk,
        "arguments_schema": dict(arguments_schema) if arguments_schema is not None else None,
    }


def _present(**fields: Any) -> JSON:
    """Only the optional fields that were given, so the server applies its own defaults."""
    return {name: value for name, value in fields.items() if value is not None}
