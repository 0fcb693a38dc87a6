"""Steering messages from a human to the agent, and the decision about the ones a stop left
unapplied.
"""

from __future__ import annotations

from runs.actors import Actor
from runs.errors import (
    IllegalTransition,
    InvalidInput,
    NotFound,
)
from runs.ledger import ledger_append
from runs.models import (
    STOPPABLE_STATUSES,
    TERMINAL_STATUSES,
    SteeringMessage,
    SteeringStatus,
)
from runs.services._base import (
    locked_run,
    run_mark_changed,
)


def steering_queue(*, run_id: str, text: str, actor: Actor) -> SteeringMessage:
    """Queue a message for the agent. On a stopped run it waits, unapplied, for the next round."""
    text = text.strip()
    if not text:
        raise InvalidInput("text is required", field="text")
    with locked_run(run_id) as run:
        if run.status in TERMINAL_STATUSES:
            raise IllegalTransition.for_run(run, f"a {run.status} run takes no more steering")
        status = (
            SteeringStatus.QUEUED
            if run.status in STOPPABLE_STATUSES
            else SteeringStatus.UNAPPLIED_AT_STOP
        )
        message = SteeringMessage.objects.create(
            run=run, author=actor.name, text=text[:10_000], status=status
        )
        ledger_append(
            run=run,
            actor=actor,
            action="steering.queued",
            payload={"steering_id": message.pk, "status": status},
        )
        run_mark_changed(run, kind="steering.queued")
    return message


def steering_decide(
    *, run_id: str, message_id: int, carry_over: bool, actor: Actor
) -> SteeringMessage:
    """A human decides what happens to a message the agent never applied before the stop."""
    with locked_run(run_id) as run:
        message = SteeringMessage.objects.filter(run=run, pk=message_id).first()
        if message is None:
            raise NotFound(f"steering message {message_id} is not on run {run_id}")
        target = SteeringStatus.CARRIED_OVER if carry_over else SteeringStatus.DISCARDED
        if message.status == target:
            return message
        if message.status != SteeringStatus.UNAPPLIED_AT_STOP:
            raise IllegalTransition.for_run(run, f"the message is {message.status}")
        message.status = target
        message.save(update_fields=["status"])
        ledger_append(
            run=run, actor=actor, action=f"steering.{target}", payload={"steering_id": message.pk}
        )
        run_mark_changed(run, kind=f"steering.{target}")
    return message
