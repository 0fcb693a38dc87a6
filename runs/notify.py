"""Run-change notifications, published only after the transaction commits.

Domain code calls `run_changed(...)` inside its transaction; listeners (the Channels publisher
registered by `console.apps`) are called from `transaction.on_commit`, so nobody ever sees a
change that was rolled back and nothing slow runs while the run row is locked.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)

Listener = Callable[[dict[str, Any]], None]
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> None:
    if listener not in _listeners:
        _listeners.append(listener)


def unsubscribe(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def _deliver(event: dict[str, Any]) -> None:
    for listener in list(_listeners):
        try:
            listener(event)
        except Exception:  # a broken listener must never undo or block a committed stop
            logger.exception("run-change listener failed for %s", event.get("run_id"))


# Events committed while `held()` is open in this thread: kept for the caller to `deliver`.
_held = threading.local()


@contextmanager
def held() -> Iterator[list[dict[str, Any]]]:
    """Keep the events this thread commits in a list instead of delivering them at commit.

    For a caller whose answer must not wait for the publishing (the MCP gateway's permit, the
    one thing between an agent's tool call and its tool): it answers, then `deliver`s them.
    """
    events: list[dict[str, Any]] = []
    outer = getattr(_held, "events", None)
    _held.events = events
    try:
        yield events
    finally:
        _held.events = outer


def deliver(events: list[dict[str, Any]]) -> None:
    for event in events:
        _deliver(event)


def _committed(event: dict[str, Any]) -> None:
    events = getattr(_held, "events", None)
    if events is not None:
        events.append(event)
    else:
        _deliver(event)


def run_changed(run: Any, *, kind: str, **extra: Any) -> None:
    event = {
        "type": "run.updated",
        "kind": kind,
        "run_id": run.pk,
        "team": run.team_id,
        "status": run.status,
        "stop_epoch": run.stop_epoch,
        "seq": run.change_seq,
        **extra,
    }
    transaction.on_commit(lambda: _committed(event))


def stop_signal(run: Any, stop_request: Any) -> None:
    """The signal pushed to the run's worker the moment the stop commits."""
    event = {
        "type": "stop.signal",
        "kind": "stop_signal",
        "run_id": run.pk,
        "team": run.team_id,
        "status": run.status,
        "stop_epoch": run.stop_epoch,
        "seq": run.change_seq,
        "signal": signal_payload(stop_request),
    }
    transaction.on_commit(lambda: _deliver(event))


def signal_payload(stop_request: Any) -> dict[str, Any]:
    return {
        "type": "cancel_requested",
        "reason": stop_request.reason,
        "requested_by": stop_request.requested_by,
        "stop_epoch": stop_request.epoch_after,
        "stop_request_id": stop_request.pk,
        "requested_at": stop_request.requested_at.isoformat(),
    }


_DECISION_OF_STATUS = {
    "approved": "approve",
    "rejected": "reject",
    "expired": "expire",
    "void": "void",
}


def approval_decided(run: Any, approval: Any) -> None:
    """The decision pushed to the run's worker the moment it commits (DESIGN §10), on the
    same path as the stop signal. The approval's GET is the worker's fallback."""
    record = approval.execution_record
    decision = {
        "type": "approval.decided",
        "approval_id": approval.public_id,
        "tool_call_id": record.tool_call_id if record is not None else None,
        "outbox_id": approval.outbox_item.public_id if approval.outbox_item_id else None,
        "decision": _DECISION_OF_STATUS[approval.status],
        "status": approval.status,
        "arguments": approval.arguments if approval.status == "approved" else None,
        "message": approval.message,
        "permit_id": (
            record.permit_id if record is not None and approval.status == "approved" else None
        ),
        "epoch": approval.epoch,
    }
    event = {
        "type": "approval.decided",
        "kind": "approval_decided",
        "run_id": run.pk,
        "team": run.team_id,
        "decision": decision,
    }
    transaction.on_commit(lambda: _deliver(event))


def token_revoked(token: Any) -> None:
    """A revoked token's open agent sockets close at once (after the revocation commits), so a
    revoked worker neither hears the next stop nor moves the run with an `ack`."""
    event = {"type": "token.revoked", "kind": "token_revoked", "token_id": token.pk}
    transaction.on_commit(lambda: _deliver(event))
