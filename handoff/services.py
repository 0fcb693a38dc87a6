"""What happens after a stop, on the handoff side: resolve unknowns, hand off to a human, assign,
accept, complete, return to automation, close.

`handoff` sits above `runs` (docs/ARCHITECTURE.md, "Layers"): every function here opens the run's
`locked_run` transaction (run row first, then the handoff: the one lock order) and moves the
run through the public runs services. The three moments of a runs transition that are handoff's
work — the stop packet, opening a handoff for a clean takeover, ending open handoffs on a direct
resume or close — are registered in `runs.hooks` by `handoff.apps` and run in that transaction.
Taking over (`runs.services.run_takeover`) and deciding frozen outbox items or unapplied steering
(`runs.services.outbox_release` / `outbox_discard` / `steering_decide`) are runs transitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from handoff.models import (
    Handoff,
    HandoffStatus,
    Resolution,
    ResolutionDecision,
    ResolutionTarget,
    StopPacket,
)
from runs.access import (
    ROLE_CAPABILITIES,
    Capability,
    is_admin_of_every_team,
    membership_roles,
)
from runs.actors import Actor
from runs.errors import (
    AssignedToSomeoneElse,
    Forbidden,
    IllegalTransition,
    InvalidInput,
    NotFound,
)
from runs.hooks import HandoffOpened
from runs.ledger import ledger_append
from runs.models import Run, RunStatus, StopRequest
from runs.selectors import run_dirty_reasons
from runs.services import (
    RESOLVABLE_STATUSES,
    locked_run,
    resolution_apply,
    run_close_locked,
    run_mark_changed,
    run_move,
    run_resume_locked,
)

OPEN_HANDOFF = (HandoffStatus.OPEN, HandoffStatus.ACCEPTED)


# --------------------------------------------------------------------------------------------
# resolutions


@dataclass
class ResolveResult:
    target: str
    target_id: str
    decision: str
    created: bool
    run_status: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def resolution_record(
    *, run_id: str, target: str, target_id: str, decision: str, evidence: str, actor: Actor
) -> ResolveResult:
    """A reviewer decides one unknown: applied / not applied / compensated, with evidence.

    Deciding twice the same way is a retry (created=False); deciding otherwise is refused.
    """
    if target not in ResolutionTarget.values:
        raise InvalidInput("target must be tool_call, outbox or worker", field="target")
    if decision not in ResolutionDecision.values:
        raise InvalidInput(
            f"decision must be one of {', '.join(ResolutionDecision.values)}", field="decision"
        )
    if not evidence.strip():
        raise InvalidInput("evidence is required: say how you know", field="evidence")
    with locked_run(run_id) as run:
        existing = Resolution.objects.filter(run=run, target=target, target_id=target_id).first()
        if existing is not None:
            if existing.decision != decision:
                raise IllegalTransition.for_run(
                    run, f"{target} {target_id} was already resolved as {existing.decision}"
                )
            return ResolveResult(target, target_id, decision, created=False, run_status=run.status)
        if run.status not in RESOLVABLE_STATUSES:
            raise IllegalTransition.for_run(run, f"a {run.status} run has nothing to resolve yet")
        try:
            with transaction.atomic():
                Resolution.objects.create(
                    run=run,
                    target=target,
                    target_id=target_id,
                    decision=decision,
                    evidence=evidence,
                    by=actor.name,
                )
        except IntegrityError:
            raise IllegalTransition.for_run(run, "already resolved") from None
        resolution_apply(
            run,
            target=target,
            target_id=target_id,
            decision=decision,
            evidence=evidence,
            actor=actor,
        )
        return ResolveResult(target, target_id, decision, created=True, run_status=run.status)


# --------------------------------------------------------------------------------------------
# handoffs


def handoff_open_for_takeover(
    run: Run, stop_request: StopRequest, actor: Actor, note: str, packet: Any
) -> HandoffOpened:
    """`runs.hooks` hand_off: a takeover settled clean, so a human gets the run (and its packet).

    The person who asked for the takeover is the assignee, if a user asked.
    """
    if packet is None:
        packet = StopPacket.objects.filter(run=run, stop_epoch=run.stop_epoch).first()
    requester = stop_request.requested_by if stop_request.actor_kind == "user" else ""
    assignee = get_user_model().objects.filter(username=requester).first() if requester else None
    # The person who took the run over is taking it: their handoff starts accepted (an open
    # handoff would sit in the team's inbox as if nobody had it).
    accepted = assignee is not None and _may_take_handoffs(assignee, run.team_id)
    handoff = Handoff.objects.create(
        run=run,
        stop_packet=packet,
        assignee=assignee,
        created_by=actor.name,
        note=note or stop_request.note,
        status=HandoffStatus.ACCEPTED if accepted else HandoffStatus.OPEN,
        accepted_at=timezone.now() if accepted else None,
    )
    # The run's `handed_off` ledger entry says it was accepted (HandoffOpened.accepted).
    return HandoffOpened(
        handoff_id=handoff.pk,
        assignee=assignee.get_username() if assignee else None,
        accepted=accepted,
    )


def handoffs_end_open(run: Run, status: str) -> None:
    """`runs.hooks` handoffs_end: a handed-off run resumed or closed directly ends its handoff."""
    Handoff.objects.filter(run=run, status__in=OPEN_HANDOFF).update(
        status=status, closed_at=timezone.now()
    )


@contextmanager
def _locked_handoff(handoff_id: int) -> Iterator[tuple[Handoff, Run]]:
    run_id = Handoff.objects.filter(pk=handoff_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"handoff {handoff_id} does not exist")
    with locked_run(run_id) as run:  # run first, then the handoff: the one lock order
        yield Handoff.objects.select_for_update().get(pk=handoff_id), run


def _require_open(handoff: Handoff, run: Run) -> None:
    if handoff.status not in OPEN_HANDOFF:
        raise IllegalTransition.for_run(run, f"the handoff is {handoff.status}")
    if run.status != RunStatus.HANDED_OFF:
        raise IllegalTransition.for_run(run, "the run is not handed off")


def handoff_accept(
    *, handoff_id: int, user: AbstractBaseUser, actor: Actor, take_from_assignee: bool = False
) -> Handoff:
    """A human takes ownership; accepting twice is a no-op, someone else's is refused.

    A handoff assigned to someone else is theirs to start: taking it needs
    `take_from_assignee` (the console asks first), so a click meant for another card never
    quietly takes a colleague's work."""
    with _locked_handoff(handoff_id) as (handoff, run):
        _require_open(handoff, run)
        if handoff.status == HandoffStatus.ACCEPTED:
            if handoff.assignee_id != user.pk:
                raise Forbidden(f"already accepted by {handoff.assignee}")
            return handoff
        if handoff.assignee_id not in (None, user.pk) and not take_from_assignee:
            raise AssignedToSomeoneElse.for_run(
                run,
                f"assigned to {handoff.assignee}: confirm to take it from them",
                assignee=str(handoff.assignee),
            )
        handoff.status = HandoffStatus.ACCEPTED
        handoff.assignee = user  # type: ignore[assignment]
        handoff.accepted_at = timezone.now()
        handoff.save(update_fields=["status", "assignee", "accepted_at"])
        ledger_append(
            run=run, actor=actor, action="handoff.accepted", payload={"handoff_id": handoff.pk}
        )
        run_mark_changed(run, kind="handoff.accepted")
    return handoff


def _may_take_handoffs(user: AbstractBaseUser, team_id: int) -> bool:
    """Whether `user` may act on a run of the team: an active reviewer or admin there, or staff."""
    if not user.is_active:
        return False
    if is_admin_of_every_team(user):
        return True
    role = membership_roles(user_id=user.pk).get(team_id)  # type: ignore[arg-type]
    return role is not None and Capability.REVIEW in ROLE_CAPABILITIES[role]


def handoff_assign(*, handoff_id: int, assignee: AbstractBaseUser | None, actor: Actor) -> Handoff:
    """Give an open handoff to a person who may act on the run (or to nobody).

    Assigning is not accepting: the assignee still accepts it. An accepted handoff given to
    someone else goes back to open for the new assignee to accept; assigning the person it
    already has is a no-op (a double click writes nothing).
    """
    with _locked_handoff(handoff_id) as (handoff, run):
        _require_open(handoff, run)
        if assignee is not None and not _may_take_handoffs(assignee, run.team_id):
            raise Forbidden(
                f"{assignee.get_username()} cannot take it: a handoff goes to a reviewer of the "
                "run's team"
            )
        new_id = assignee.pk if assignee is not None else None
        if handoff.assignee_id == new_id:
            return handoff
        previous = handoff.assignee.get_username() if handoff.assignee is not None else None
        handoff.assignee = assignee  # type: ignore[assignment]
        fields = ["assignee"]
        if handoff.status == HandoffStatus.ACCEPTED:
            handoff.status = HandoffStatus.OPEN
            handoff.accepted_at = None
            fields += ["status", "accepted_at"]
        handoff.save(update_fields=fields)
        ledger_append(
            run=run,
            actor=actor,
            action="handoff.assigned",
            payload={
                "handoff_id": handoff.pk,
                "assignee": assignee.get_username() if assignee is not None else None,
                "previous": previous,
            },
        )
        run_mark_changed(run, kind="handoff.assigned")
    return handoff


def handoff_complete(*, handoff_id: int, actor: Actor, note: str = "") -> Handoff:
    """The human finished the work by hand: handed_off → completed."""
    with _locked_handoff(handoff_id) as (handoff, run):
        _require_open(handoff, run)
        _end_handoff(handoff, HandoffStatus.COMPLETED, note)
        run.finished_at = timezone.now()
        run_move(
            run,
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
    with _locked_handoff(handoff_id) as (handoff, run):
        _require_open(handoff, run)
        if run_dirty_reasons(run):
            raise IllegalTransition("resolve the run's unknown side effects first")
        _end_handoff(handoff, HandoffStatus.RETURNED, note)
        run_resume_locked(
            run,
            actor=actor,
            checkpoint=checkpoint,
            carry_over_steering=carry_over_steering,
            note=note,
            via="returned_to_automation",
        )
    return handoff


def handoff_close(*, handoff_id: int, actor: Actor, note: str = "") -> Handoff:
    """Close without resuming: handed_off → cancelled. The reason is required: closing ends the
    run for good, and the ledger must say why to whoever reads it later."""
    if not note.strip():
        raise InvalidInput("say why the run is closed", field="note")
    with _locked_handoff(handoff_id) as (handoff, run):
        _require_open(handoff, run)
        _end_handoff(handoff, HandoffStatus.CLOSED, note)
        run_close_locked(run, actor=actor, note=note or "closed from handoff")
    return handoff


def _end_handoff(handoff: Handoff, status: str, note: str) -> None:
    handoff.status = status
    handoff.closed_at = timezone.now()
    if note:
        handoff.note = f"{handoff.note}\n{note}".strip()
    handoff.save(update_fields=["status", "closed_at", "note"])
