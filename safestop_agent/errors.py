"""Errors the server answers with, as exceptions an agent can branch on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# 409 codes that mean "the server refuses to let this work start or move on":
# the run was stopped, the epoch is stale, or the lease is gone. They are
# decisions, not glitches, so they are never retried. (A run over budget is
# stopped with reason `budget_exhausted`; its permits then fail `stale_epoch`. A
# team over its daily or monthly budget answers `budget_exhausted` itself, and the
# run is stopped with it.)
REFUSAL_CODES = frozenset(
    {"stale_epoch", "run_not_running", "lease_revoked", "illegal_transition", "budget_exhausted"}
)


class ApiError(Exception):
    """A non-2xx answer: `{"error": code, "detail": ..., "status": ..., "stop_epoch": ...}`."""

    def __init__(self, status_code: int, code: str, detail: str, body: Any = None) -> None:
        super().__init__(f"{status_code} {code}: {detail}")
        self.status_code = status_code
        self.code = code
        self.detail = detail
        self.body = body

    @property
    def run_status(self) -> str | None:
        """The run's current status, when the server included it."""
        return self._body_field("status")

    @property
    def stop_epoch(self) -> int | None:
        """The run's current epoch, when the server included it."""
        value = self._body_field("stop_epoch")
        return value if isinstance(value, int) else None

    @property
    def is_transient(self) -> bool:
        """True for answers worth retrying: server errors and rate limiting."""
        return self.status_code >= 500 or self.status_code in (408, 429)

    def _body_field(self, name: str) -> Any:
        return self.body.get(name) if isinstance(self.body, dict) else None


class Refused(ApiError):
    """409 refusal: the run is stopped, the epoch is stale or the lease was revoked."""


class ToolCallConflict(ApiError):
    """`409 tool_call_conflict`: this `tool_call_id` was first asked for another call.

    An id names one call: the server granted nothing and named the first ask
    (`first_tool`, `first_arguments`). Not a stop and never retried: the agent
    gave two calls one id (derive it from the framework's call id, never a position).
    """

    CODE = "tool_call_conflict"

    @property
    def tool_call_id(self) -> str | None:
        value = self._body_field("tool_call_id")
        return str(value) if value is not None else None

    @property
    def first_tool(self) -> str | None:
        value = self._body_field("first_tool")
        return str(value) if value is not None else None

    @property
    def first_arguments(self) -> Any:
        """The arguments the id was first asked with (as the server sent them)."""
        return self._body_field("first_arguments")


class ClientTooOld(ApiError):
    """The server needs a newer `safestop-agent` than this one (`426 client_too_old`).

    Every request names the client's version; a server configured with a higher
    `SAFESTOP_MIN_AGENT_VERSION` refuses it before doing anything, so an old
    client never half-understands a newer contract. Upgrade the package.
    """

    CODE = "client_too_old"

    @property
    def minimum_version(self) -> str | None:
        value = self._body_field("minimum_version")
        return str(value) if value else None

    @property
    def client_version(self) -> str | None:
        value = self._body_field("client_version")
        return str(value) if value else None


class ApprovalRejected(Exception):
    """A reviewer did not approve: the call never started and never will.

    `status` is the approval's: `rejected` (a reviewer said no), `expired` (no
    decision before the deadline: deny by default) or `void` (a stop, takeover
    or lost lease ended the wait). `message` is the reviewer's text for the
    agent, so the model can be told why; `approval` is what the server sent.
    """

    def __init__(
        self, message: str, status: str, approval: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"approval {status}: {message}" if message else f"approval {status}")
        self.message = message
        self.status = status
        self.approval: Mapping[str, Any] = approval or {}

    @property
    def approval_id(self) -> str | None:
        value = self.approval.get("approval_id") or self.approval.get("id")
        return str(value) if value else None


class NoPermit(Exception):
    """The server answered a permit request without a `permit_id` and nothing to wait on.

    A call never starts without a permit id (DESIGN §10): such an answer means
    "not yet", and the agent fails closed.
    """

    def __init__(self, answer: Any) -> None:
        super().__init__(f"no permit_id in the permit answer: {answer!r}"[:500])
        self.answer = answer


class ClientDisconnected(RuntimeError):
    """This client's connections were closed (`WireClient.disconnect`) and a request came after:
    a heartbeat thread or a listener still running when its owner shut the client down."""
