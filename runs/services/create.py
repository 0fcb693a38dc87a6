"""Creating a run with its planned steps; idempotent on the caller's key."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db import IntegrityError, transaction

from runs import notify
from runs.actors import Actor
from runs.ledger import ledger_append
from runs.models import (
    Run,
    Step,
    StepKind,
    Team,
)


@dataclass
class PlannedStep:
    key: str
    name: str = ""
    kind: str = StepKind.MODEL_CALL


def run_create(
    *,
    team: Team,
    title: str,
    agent: str,
    actor: Actor,
    steps: list[PlannedStep] | None = None,
    max_seconds: int | None = None,
    max_tool_calls: int | None = None,
    max_cost_usd: Decimal | None = None,
    max_tokens: int | None = None,
    idempotency_key: str = "",
) -> Run:
    run, _created = run_create_or_get(
        team=team,
        title=title,
        agent=agent,
        actor=actor,
        steps=steps,
        max_seconds=max_seconds,
        max_tool_calls=max_tool_calls,
        max_cost_usd=max_cost_usd,
        max_tokens=max_tokens,
        idempotency_key=idempotency_key,
    )
    return run


def run_create_or_get(
    *,
    team: Team,
    title: str,
    agent: str,
    actor: Actor,
    steps: list[PlannedStep] | None = None,
    max_seconds: int | None = None,
    max_tool_calls: int | None = None,
    max_cost_usd: Decimal | None = None,
    max_tokens: int | None = None,
    idempotency_key: str = "",
) -> tuple[Run, bool]:
    """Create a run; with an idempotency key, a retry returns the first run (created=False)."""
    if idempotency_key:
        existing = Run.objects.filter(team=team, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing, False
    try:
        with transaction.atomic(durable=True):
            run = Run.objects.create(
                team=team,
                title=title,
                agent=agent,
                max_seconds=max_seconds,
                max_tool_calls=max_tool_calls,
                max_cost_usd=max_cost_usd,
                max_tokens=max_tokens,
                created_by=actor.name,
                idempotency_key=idempotency_key,
            )
            Step.objects.bulk_create(
                Step(run=run, seq=index, key=step.key, name=step.name or step.key, kind=step.kind)
                for index, step in enumerate(steps or [], start=1)
            )
            ledger_append(
                run=run, actor=actor, action="run.created", payload={"title": title, "agent": agent}
            )
            notify.run_changed(run, kind="run.created")
    except IntegrityError:
        # Two concurrent retries with one key: the unique constraint lets one through.
        existing = (
            Run.objects.filter(team=team, idempotency_key=idempotency_key).first()
            if idempotency_key
            else None
        )
        if existing is None:
            raise
        return existing, False
    return run, True
