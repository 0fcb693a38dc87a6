"""What a worker hears about approvals (DESIGN §10), from the push socket or a GET.

A decision reaches the worker two ways: an `approval.decided` frame on the
run's agent socket (the fast path, the same one a stop takes), or the
approval's own `GET /api/v1/approvals/{id}/` (the fallback, polled while it
waits). Both become one `ApprovalDecision`, posted on the run's
`ApprovalBoard`, where a waiting tool call or outbox item finds it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .wire import ApprovalInfo

DecidedStatus = Literal["approved", "rejected", "expired", "void"]

# The push frame names the decision with a verb, the approval its status.
_STATUS_OF_DECISION: dict[str, DecidedStatus] = {
    "approve": "approved",
    "reject": "rejected",
    "expire": "expired",
    "void": "void",
}
_DECIDED: dict[str, DecidedStatus] = {status: status for status in _STATUS_OF_DECISION.values()}

# Marks "the decision did not say": the frame or answer had no `arguments` key.
NOT_GIVEN: Any = object()


@dataclass(frozen=True)
class ApprovalDecision:
    """The end of one approval's wait: who said what, and with which arguments.

    `arguments` are the final arguments (`NOT_GIVEN` when the source did not
    carry them); `permit_id` is set once an approved tool call has its permit.
    """

    approval_id: str
    status: DecidedStatus
    message: str = ""
    arguments: Any = field(default=NOT_GIVEN, repr=False)
    permit_id: str | None = None
    tool_call_id: str | None = None
    source: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def approved(self) -> bool:
        return self.status == "approved"


def decision_from_frame(frame: Mapping[str, Any]) -> ApprovalDecision | None:
    """`{"type": "approval.decided", "approval_id", "tool_call_id", "decision", ...}` → decision."""
    if frame.get("type") != "approval.decided":
        return None
    status = _STATUS_OF_DECISION.get(str(frame.get("decision")))
    approval_id = frame.get("approval_id")
    if status is None or not approval_id:
        return None
    return ApprovalDecision(
        approval_id=str(approval_id),
        status=status,
        message=str(frame.get("message") or ""),
        # A frame's `arguments: null` says nothing: the approval's GET has the final ones.
        arguments=_given(frame.get("arguments")),
        permit_id=_text_or_none(frame.get("permit_id")),
        tool_call_id=_text_or_none(frame.get("tool_call_id")),
        source=dict(frame),
    )


def decision_from_approval(approval: ApprovalInfo | Mapping[str, Any]) -> ApprovalDecision | None:
    """A decided approval (`GET /api/v1/approvals/{id}/`) → decision; None while it waits."""
    status = _DECIDED.get(str(approval.get("status")))
    approval_id = approval.get("id")
    if status is None or not approval_id:
        return None
    return ApprovalDecision(
        approval_id=str(approval_id),
        status=status,
        message=str(approval.get("message") or ""),
        arguments=approval.get("arguments", NOT_GIVEN),
        permit_id=_text_or_none(approval.get("permit_id")),
        tool_call_id=_text_or_none(approval.get("tool_call_id")),
        source=dict(approval),
    )


class ApprovalBoard:
    """Decisions this worker has heard of, by approval id; waiters are woken on each.

    A decision may arrive before anyone waits for it (a quick reviewer, an
    outbox item whose approval id is only known from the enqueue answer), so
    the board keeps the latest `keep` decisions rather than only those asked for.
    The first decision heard for an approval is kept: a decision is taken once.
    """

    def __init__(self, keep: int = 512) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._decisions: OrderedDict[str, ApprovalDecision] = OrderedDict()
        self._wakers: list[Callable[[], object]] = []

    def post(self, decision: ApprovalDecision) -> None:
        with self._lock:
            self._decisions.setdefault(decision.approval_id, decision)
            while len(self._decisions) > self._keep:
                self._decisions.popitem(last=False)
            wakers = list(self._wakers)
        for wake in wakers:
            wake()

    def get(self, approval_id: str) -> ApprovalDecision | None:
        with self._lock:
            return self._decisions.get(approval_id)

    def on_post(self, wake: Callable[[], object]) -> Callable[[], None]:
        """Call `wake` after every posted decision; returns a function that unregisters it."""
        with self._lock:
            self._wakers.append(wake)

        def forget() -> None:
            with self._lock:
                if wake in self._wakers:
                    self._wakers.remove(wake)

        return forget


def _given(value: Any) -> Any:
    return NOT_GIVEN if value is None else value


def _text_or_none(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)
