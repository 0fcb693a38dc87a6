"""What a handoff can do: take over, resolve unknowns, accept, complete, return, close.

Takeover and resolution share the stop's settle logic, so they live in `runs.services` and
are re-exported here; the handoff's own transitions lock the run row first like every other.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from handoff.models import Handoff, HandoffStatus
from runs.actors import Actor
from runs.errors import Forbidden, IllegalTransition, NotFound
from runs.ledger import ledger_append
from runs.models import RunStatus
from runs.services import (  # noqa: F401  (re-exported: the handoff's whole story in one place)
    _changed,
    _close_locked,
    _lock_run,
    _move,
    _resume_locked,
    outbox_discard,
    outbox_release,
    resolution_record,
    run_dirty_reasons,
    run_takeover,
    steering_decide,
)

OPEN_HANDOFF = (HandoffStatus.OPEN, HandoffStatus.ACCEPTED)


def _lock_handoff(handoff_id: int) -> tuple[Handoff, object]:
    run_id = Handoff.objects.filter(pk=handoff_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"handoff {handoff_id} does not exist")
    run = _lock_run(run_id)  # run first, then the handoff: the one lock order
    handoff = Handoff.objects.select_for_update().get(pk=handoff_id)
    return handoff, run


def _require_open(handoff: Handoff, run: object) -> None:
    if handoff.status not in OPEN_HANDOFF:
        raise IllegalTransition(
            f"the handoff is {handoff.status}",
            status=getattr(run, "status", None),
            stop_epoch=getattr(run, "stop_epoch", None),
        )
    if getattr(run, "status", None) != RunStatus.HANDED_OFF:
        raise IllegalTransition(
            "the run is not handed off",
            status=getattr(run, "status", None),
            stop_epoch=getattr(run, "stop_epoch", None),
        )


def handoff_accept(*, handoff_id: int, user: AbstractBaseUser, actor: Actor) -> Handoff:
    """A human takes ownership; accepting twice is a no-op, someone else's is refused."""
    with transaction.atomic(durable=True):
        handoff, run = _lock_handoff(handoff_id)
        _require_open(handoff, run)
        if handoff.status == HandoffStatus.ACCEPTED:
            if handoff.assignee_id != user.pk:
                raise Forbidden(f"already accepted by {handoff.assignee}")
            return handoff
        handoff.status = HandoffStatus.ACCEPTED
        handoff.assignee = user  # type: ignore[assignment]
        handoff.accepted_at = timezone.now()
        handoff.save(update_fields=["status", "assignee", "accepted_at"])
        ledger_append(
            run=run,  # type: ignore[arg-type]
            actor=actor,
            action="handoff.accepted",
            payload={"handoff_id": handoff.pk},
        )
        _changed(run, kind="handoff.accepted")  # type: ignore[arg-type]
    return handoff


def handoff_complete(*, handoff_id: int, actor: Actor, note: str = "") -> Handoff:
    """The human finished the work by hand: handed_off → completed."""
    with transaction.atomic(durable=True):
        handoff, run = _lock_handoff(handoff_id)
        _require_open(handoff, run)
        _end_handoff(handoff, HandoffStatus.COMPLETED, note)
        run.finished_at = timezone.now()  # type: ignore[attr-defined]
        _move(
            run,  # type: ignore[arg-type]
            RunStatus.COMPLETED,
            actor=actor,
            action="handoff.completed",
            reason="human_completed",
            payload={"handoff_id": handoff.pk, "note": note},
            fields=("finished_at",),
        )
    return handoff


def handoff_return(
    *,
    handoff_id: int,
    actor: Actor,
    checkpoint: str = "",
    carry_over_steering: bool = False,
    note: str = "",
) -> Handoff:
    """Give the run back to automation: pending at a new epoch, from a checkpoint if chosen."""
    with transaction.atomic(durable=True):
        handoff, run = _lock_handoff(handoff_id)
        _require_open(handoff, run)
        if run_dirty_reasons(run):  # type: ignore[arg-type]
            raise IllegalTransition("resolve the run's unknown side effects first")
        _end_handoff(handoff, HandoffStatus.RETURNED, note)
        _resume_locked(
            run,  # type: ignore[arg-type]
            actor=actor,
            checkpoint=checkpoint,
            carry_over_steering=carry_over_steering,
            via="returned_to_automation",
        )
    return handoff


def handoff_close(*, handoff_id: int, actor: Actor, note: str = "") -> Handoff:
    """Close without resuming: handed_off → cancelled."""
    with transaction.atomic(durable=True):
        handoff, run = _lock_handoff(handoff_id)
        _require_open(handoff, run)
        _end_handoff(handoff, HandoffStatus.CLOSED, note)
        _close_locked(run, actor=actor, note=note or "closed from handoff")  # type: ignore[arg-type]
    return handoff


def _end_handoff(handoff: Handoff, status: str, note: str) -> None:
    handoff.status = status
    handoff.closed_at = timezone.now()
    if note:
        handoff.note = f"{handoff.note}\n{note}".strip()
    handoff.save(update_fields=["status", "closed_at", "note"])
