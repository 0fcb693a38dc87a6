"""The outbox: side effects the server dispatches for the agent. Enqueue (at the entrance),
claim (serialised with the stop on the run row), outcome, the reaper, and a reviewer's
release / discard of frozen items.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db.models import F
from django.utils import timezone

from runs import frozen, hooks
from runs.actors import Actor
from runs.errors import (
    IllegalTransition,
    InvalidInput,
    NotFound,
    RunNotRunning,
    StaleEpoch,
)
from runs.ledger import ledger_append
from runs.models import (
    STOPPED_STATUSES,
    TERMINAL_STATUSES,
    ExecutionRecord,
    OutboxItem,
    OutboxStatus,
    RunStatus,
)
from runs.services._base import (
    IN_FLIGHT_OUTBOX,
    check_work_may_start,
    locked_run,
    reject_late_write,
    run_mark_changed,
)
from runs.services.approval_gate import (
    ApprovalAsk,
    approval_gate,
    gate_for_item,
    hold_for_approval,
    validate_arguments_schema,
    validate_risk,
)
from runs.services.lifecycle import settle_dirty_if_resolved

TRANSPORTS = ("webhook", "email")


def _webhook_host_allowed(destination: str) -> bool:
    # urlsplit and .port raise ValueError on malformed input (a port out of range or not a
    # number, an unclosed IPv6 bracket): such a URL is simply not on the allow-list.
    try:
        parts = urlsplit(destination)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    if any(char in destination for char in "\r\n\t\x00 "):
        return False
    allowed = {host.lower() for host in settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS}
    host = parts.hostname.lower()
    with_port = f"{host}:{port}" if port else host
    return with_port in allowed or (port is None and host in allowed)


def _is_email_address(destination: str) -> bool:
    # Django's validator refuses CR/LF and other header-injection material: an address that
    # passed here cannot end `unknown` at send time (a dirty stop for nothing).
    try:
        validate_email(destination)
    except ValidationError:
        return False
    return len(destination) <= 254


def validate_outbox_destination(transport: str, destination: str) -> None:
    if transport not in TRANSPORTS:
        raise InvalidInput(f"transport must be one of {', '.join(TRANSPORTS)}", field="transport")
    if transport == "webhook" and not _webhook_host_allowed(destination):
        raise InvalidInput(
            "webhook destination is not an http(s) URL on SAFESTOP_WEBHOOK_ALLOWED_HOSTS",
            field="destination",
        )
    if transport == "email" and not _is_email_address(destination):
        raise InvalidInput(
            "email destination must be one address (no line breaks, at most 254 characters)",
            field="destination",
        )


def outbox_enqueue(
    *,
    run_id: str,
    epoch: int,
    transport: str,
    destination: str,
    payload: dict[str, Any],
    idempotency_key: str,
    actor: Actor,
    tool_call_id: str = "",
    needs_approval: bool = False,
    summary: str = "",
    risk: str = "",
    arguments_schema: dict[str, Any] | None = None,
) -> tuple[OutboxItem, bool]:
    """Queue a side effect for the server to dispatch. A retry returns the first item.

    An item a team rule (or `needs_approval`) holds waits `awaiting_approval`, which no
    dispatcher claims, with a waiting `Approval` (`item.approval`) over its payload (DESIGN §10).
    """
    validate_outbox_destination(transport, destination)
    ask = ApprovalAsk(
        needs_approval, summary, validate_risk(risk), validate_arguments_schema(arguments_schema)
    )
    if not idempotency_key:
        raise InvalidInput("idempotency_key is required", field="idempotency_key")
    refusal: StaleEpoch | RunNotRunning | None
    with locked_run(run_id) as run:
        existing = OutboxItem.objects.filter(run=run, idempotency_key=idempotency_key).first()
        if existing is not None:
            return frozen.present(run, [existing])[0], False
        now = timezone.now()
        refusal = check_work_may_start(run, epoch, now=now)
        verdict = hooks.NO_VERDICT
        if (
            refusal is None
            and (
                verdict := hooks.policies().outbox(
                    run, transport=transport, destination=destination, payload=payload, now=now
                )
            ).stopped
        ):
            refusal = RunNotRunning.for_run(run, verdict.stopped)
        if refusal is None:
            gate = approval_gate(
                verdict,
                lambda: gate_for_item(
                    run, transport=transport, destination=destination, needs_approval=needs_approval
                ),
            )
            record = (
                ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first()
                if tool_call_id
                else None
            )
            item = OutboxItem.objects.create(
                run=run,
                execution_record=record,
                transport=transport,
                destination=destination,
                payload=payload,
                idempotency_key=idempotency_key,
                enqueue_epoch=epoch,
                status=(
                    OutboxStatus.AWAITING_APPROVAL if gate is not None else OutboxStatus.PENDING
                ),
            )
            ledger_append(
                run=run,
                actor=actor,
                action="outbox.enqueued",
                payload={
                    "outbox_id": item.public_id,
                    "transport": transport,
                    "idempotency_key": idempotency_key,
                    "held": gate is not None,
                },
            )
            # The committing process's dispatcher claims a dispatchable item by its id, without
            # scanning the queue for it (runs.local_dispatch); a held one it leaves alone.
            run_mark_changed(
                run, kind="outbox.enqueued", outbox_id=item.pk if gate is None else None
            )
            hold_for_approval(run, gate, item, ask=ask, actor=actor, now=now)
            return item, True
    reject_late_write(run_id, kind="outbox", epoch=epoch, error=refusal)
    raise refusal


def outbox_claim(*, item_id: int, dispatcher: str) -> OutboxItem | None:
    """Claim one item for sending, or None. Serialises with the stop on the run row.

    An item is either claimed here before the stop commits (then it is in flight and its
    outcome is recorded), or frozen by the stop — never sent after it.
    """
    # Which run owns it never changes: read outside the transaction, whose first query is the lock.
    run_id = OutboxItem.objects.filter(pk=item_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return None
    with locked_run(run_id) as run:
        item = OutboxItem.objects.select_for_update().get(pk=item_id)
        released = item.status == OutboxStatus.RELEASED
        open_for_dispatch = (
            item.status == OutboxStatus.PENDING
            and run.status == RunStatus.RUNNING
            and item.enqueue_epoch == run.stop_epoch
        )
        if not (released or open_for_dispatch):
            return None
        now = timezone.now()
        item.status = OutboxStatus.DISPATCHING
        item.claimed_at = now
        item.claimed_by = dispatcher[:120]
        item.claim_epoch = run.stop_epoch
        item.attempts += 1
        item.save(
            update_fields=[
                "status",
                "claimed_at",
                "claimed_by",
                "claim_epoch",
                "attempts",
                "updated_at",
            ]
        )
        ledger_append(
            run=run,
            actor=Actor.system(dispatcher[:150]),
            action="outbox.claimed",
            payload={"outbox_id": item.public_id, "epoch": run.stop_epoch, "released": released},
        )
        run_mark_changed(run, kind="outbox.claimed")
    return item


def outbox_claim_next(*, dispatcher: str, batch: int = 20) -> OutboxItem | None:
    """The dispatcher's scan: the oldest claimable item.

    Only items `outbox_claim` could accept are candidates: a pending item left at an older
    epoch (its run was interrupted, then resumed) can never be claimed, and `batch` of them at
    the head of the queue would otherwise hide every newer item from every dispatcher.

    Two queries, not one with an OR: each walks its own partial index (`outbox_pending_idx`,
    `outbox_released_idx`) in `created_at` order and stops after `batch` rows. With the OR the
    planner visited every outbox row of every running or stopped run on each tick (64 ms a tick
    over 1M frozen items, docs/BENCHMARKS.md), on the database every stop waits for.
    """
    pending = OutboxItem.objects.filter(
        status=OutboxStatus.PENDING,
        run__status=RunStatus.RUNNING,
        enqueue_epoch=F("run__stop_epoch"),
    )
    released = OutboxItem.objects.filter(
        status=OutboxStatus.RELEASED, run__status__in=RELEASED_DISPATCHABLE_RUN_STATUSES
    )
    oldest = sorted(
        [
            *pending.order_by("created_at").values_list("created_at", "pk")[:batch],
            *released.order_by("created_at").values_list("created_at", "pk")[:batch],
        ]
    )[:batch]
    for _created_at, item_id in oldest:
        item = outbox_claim(item_id=item_id, dispatcher=dispatcher)
        if item is not None:
            return item
    return None


# The run states in which the scan picks up an item a reviewer released (as it always has).
RELEASED_DISPATCHABLE_RUN_STATUSES = (
    RunStatus.RUNNING,
    *STOPPED_STATUSES,
    RunStatus.HANDED_OFF,
    RunStatus.CANCEL_REQUESTED,
    RunStatus.DRAINING,
)


OUTBOX_OUTCOMES = (OutboxStatus.SENT, OutboxStatus.FAILED, OutboxStatus.UNKNOWN)


def outbox_record_outcome(
    *,
    item_id: int,
    outcome: str,
    dispatcher: str = "dispatcher",
    response_status: int | None = None,
    error: str = "",
) -> OutboxItem:
    """What the transport said. A late answer for an item reaped to `unknown` is still a fact."""
    if outcome not in OUTBOX_OUTCOMES:
        raise InvalidInput(f"outcome must be one of {OUTBOX_OUTCOMES}")
    # Which run owns it never changes: read outside the transaction, whose first query is the lock.
    run_id = OutboxItem.objects.filter(pk=item_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"outbox item {item_id} does not exist")
    with locked_run(run_id) as run:
        item = OutboxItem.objects.select_for_update().get(pk=item_id)
        if item.status not in IN_FLIGHT_OUTBOX or item.resolved:
            return item  # already settled (by a reviewer, or a duplicate answer)
        if item.status == OutboxStatus.UNKNOWN and outcome == OutboxStatus.UNKNOWN:
            return item
        now = timezone.now()
        item.status = outcome
        item.response_status = response_status
        item.last_error = error[:2000]
        if outcome == OutboxStatus.SENT:
            item.sent_at = now
        item.save(
            update_fields=["status", "response_status", "last_error", "sent_at", "updated_at"]
        )
        ledger_append(
            run=run,
            actor=Actor.system(dispatcher[:150]),
            action=f"outbox.{outcome}",
            payload={
                "outbox_id": item.public_id,
                "response_status": response_status,
                "error": error[:200],
            },
        )
        run_mark_changed(run, kind=f"outbox.{outcome}")
        settle_dirty_if_resolved(run, actor=Actor.system("reconciler"), now=now)
    return item


def outbox_reap_stuck(*, item_id: int, older_than_seconds: float) -> bool:
    """A dispatcher that died mid-send leaves `dispatching`: make it `unknown`, never re-send."""
    # Which run owns it never changes: read outside the transaction, whose first query is the lock.
    run_id = OutboxItem.objects.filter(pk=item_id).values_list("run_id", flat=True).first()
    if run_id is None:
        return False
    with locked_run(run_id) as run:
        item = OutboxItem.objects.select_for_update().get(pk=item_id)
        now = timezone.now()
        if item.status != OutboxStatus.DISPATCHING or item.claimed_at is None:
            return False
        if (now - item.claimed_at).total_seconds() < older_than_seconds:
            return False
        item.status = OutboxStatus.UNKNOWN
        item.last_error = (
            f"dispatcher {item.claimed_by} gave no outcome within {older_than_seconds:.0f}s"
        )
        item.save(update_fields=["status", "last_error", "updated_at"])
        ledger_append(
            run=run,
            actor=Actor.system("outbox-reaper"),
            action="outbox.unknown",
            reason="dispatch_deadline",
            payload={"outbox_id": item.public_id, "claimed_by": item.claimed_by},
        )
        run_mark_changed(run, kind="outbox.unknown")
    return True


def outbox_release(*, run_id: str, item_id: int, actor: Actor, note: str = "") -> OutboxItem:
    """A reviewer lets one frozen item go out after all (ledgered)."""
    return _decide_frozen(
        run_id=run_id, item_id=item_id, actor=actor, to=OutboxStatus.RELEASED, note=note
    )


def outbox_discard(*, run_id: str, item_id: int, actor: Actor, note: str = "") -> OutboxItem:
    return _decide_frozen(
        run_id=run_id, item_id=item_id, actor=actor, to=OutboxStatus.DISCARDED, note=note
    )


def _decide_frozen(*, run_id: str, item_id: int, actor: Actor, to: str, note: str) -> OutboxItem:
    with locked_run(run_id) as run:
        item = OutboxItem.objects.select_for_update().filter(run=run, pk=item_id).first()
        if item is None:
            raise NotFound(f"outbox item {item_id} is not on run {run_id}")
        if item.status == to:
            return item  # a double click decides once
        # Frozen by the run's epoch and not relabelled yet: decided as the relabelled row, and
        # its freeze written with the decision.
        item = frozen.present(run, [item])[0]
        if item.status != OutboxStatus.FROZEN:
            raise IllegalTransition.for_run(
                run, f"only a frozen item can be {to}; this one is {item.status}"
            )
        if run.status not in (
            *STOPPED_STATUSES,
            RunStatus.INTERRUPTED,
            RunStatus.HANDED_OFF,
            *TERMINAL_STATUSES,
        ):
            raise IllegalTransition.for_run(
                run, "frozen items are decided once the run has stopped"
            )
        item.status = to
        item.save(update_fields=["status", "frozen_at", "frozen_by_epoch", "updated_at"])
        ledger_append(
            run=run,
            actor=actor,
            action=f"outbox.{to}",
            reason=note[:60],
            payload={"outbox_id": item.public_id, "note": note},
        )
        run_mark_changed(run, kind=f"outbox.{to}")
    return item


def parse_outbox_id(value: str | int) -> int:
    text = str(value)
    if text.startswith("outbox_"):
        text = text[len("outbox_") :]
    if not text.isdigit():
        raise InvalidInput(f"{value!r} is not an outbox item id", field="id")
    return int(text)
