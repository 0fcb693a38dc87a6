"""Typed domain errors. Each carries a stable code that the API turns into its `error` field."""

from __future__ import annotations

from typing import Any, Protocol, Self


class _RunState(Protocol):
    status: str
    stop_epoch: int


class DomainError(Exception):
    code = "domain_error"
    http_status = 400

    def __init__(
        self, detail: str, *, status: str | None = None, stop_epoch: int | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.stop_epoch = stop_epoch
        self.extra = extra

    @classmethod
    def for_run(cls, run: _RunState, detail: str, **extra: Any) -> Self:
        """The error about `run` as it is now: the answer carries its status and stop epoch."""
        return cls(detail, status=run.status, stop_epoch=run.stop_epoch, **extra)

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "detail": self.detail}
        if self.status is not None:
            body["status"] = self.status
        if self.stop_epoch is not None:
            body["stop_epoch"] = self.stop_epoch
        body.update(self.extra)
        return body


class Conflict(DomainError):
    http_status = 409


class StaleEpoch(Conflict):
    code = "stale_epoch"


class RunNotRunning(Conflict):
    code = "run_not_running"


class LeaseHeld(Conflict):
    code = "lease_held"


class LeaseRevoked(Conflict):
    code = "lease_revoked"


class IllegalTransition(Conflict):
    code = "illegal_transition"


class ToolCallConflict(Conflict):
    """A `tool_call_id` asked again for another tool or other arguments (DESIGN §5).

    The id names one call: a retry of that call gets its permit, anything else gets nothing,
    and the answer names what the id was first asked for (`first_tool`, `first_arguments`).
    """

    code = "tool_call_conflict"


class AlreadyFinished(Conflict):
    """A stop that arrived after the run already finished: answered, logged, no transition."""

    code = "already_finished"


class BudgetExhausted(Conflict):
    code = "budget_exhausted"


class NotFound(DomainError):
    code = "not_found"
    http_status = 404


class InvalidInput(DomainError):
    code = "invalid"
    http_status = 400


class Forbidden(DomainError):
    code = "forbidden"
    http_status = 403


class AlreadyDecided(Conflict):
    """A second decision on an approval: answered with the first one (DESIGN §10)."""

    code = "already_decided"


class ApprovalVoid(Conflict):
    """The approval was voided by a stop, takeover, lease loss or interruption."""

    code = "approval_void"


class ApprovalClosed(Conflict):
    """A permit asked again for a call whose approval was rejected, expired or voided."""

    code = "approval_closed"


class ApprovalRateLimited(DomainError):
    """The team asked for more approvals in the last minute than its people could ever read
    (`SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE`); the call is not held, nothing was written."""

    code = "approval_rate_limited"
    http_status = 429


class BulkTooLarge(DomainError):
    """A bulk stop over the limit (SAFESTOP_BULK_STOP_LIMIT) that was not confirmed."""

    code = "bulk_too_large"
    http_status = 400


class PreviewExpired(Conflict):
    """A bulk stop confirmed on a preview older than SAFESTOP_BULK_PREVIEW_SECONDS: what it showed
    may no longer be what the reviewer would agree to; preview again."""

    code = "preview_expired"


class AssignedToSomeoneElse(Conflict):
    """Accepting a handoff assigned to another person without saying so: ask first."""

    code = "handoff_assigned"
