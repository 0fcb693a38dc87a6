"""Moves a worker makes through events, as one call each, for tests that need a run in a given
state: complete, fail, suspend (each one `runs.services.events_ingest` event) and interrupt
(what a lease expiry or a failed dependency does to a running run)."""

from __future__ import annotations

import secrets
from typing import Any

from django.utils import timezone

from runs.actors import Actor
from runs.errors import IllegalTransition, RunNotRunning, StaleEpoch
from runs.models import Run, RunStatus
from runs.services import EventAnswer, events_ingest, locked_run
from runs.services.lifecycle import _interrupt_locked


def run_complete(*, run_id: str, epoch: int, actor: Actor, result: Any = None) -> Run:
    """The worker finished. Wins over a stop only if it is recorded first (DESIGN §2)."""
    return _one_event(
        run_id,
        epoch,
        actor,
        {"event_id": "complete_" + secrets.token_hex(8), "type": "run.completed", "result": result},
    )


def run_fail(*, run_id: str, epoch: int, actor: Actor, error: Any = None) -> Run:
    return _one_event(
        run_id,
        epoch,
        actor,
        {"event_id": "fail_" + secrets.token_hex(8), "type": "run.failed", "error": error},
    )


def run_suspend(*, run_id: str, epoch: int, actor: Actor, reason: str = "") -> Run:
    return _one_event(
        run_id,
        epoch,
        actor,
        {"event_id": "suspend_" + secrets.token_hex(8), "type": "run.suspended", "reason": reason},
    )


def run_interrupt(*, run_id: str, reason: str, actor: Actor, detail: str = "") -> Run:
    """running → interrupted (a worker or dependency failed); the interruption point is kept."""
    with locked_run(run_id) as run:
        if run.status != RunStatus.RUNNING:
            raise IllegalTransition.for_run(run, f"a {run.status} run cannot be interrupted")
        _interrupt_locked(run, reason=reason, actor=actor, now=timezone.now(), detail=detail)
    return run


def _one_event(run_id: str, epoch: int, actor: Actor, event: dict[str, Any]) -> Run:
    (answer,) = events_ingest(run_id=run_id, epoch=epoch, actor=actor, events=[event])
    _raise_for_answer(run_id, answer)
    return Run.objects.get(pk=run_id)


def _raise_for_answer(run_id: str, answer: EventAnswer) -> None:
    if answer.status == "accepted":
        return
    run = Run.objects.get(pk=run_id)
    error_cls = StaleEpoch if answer.code == "stale_epoch" else RunNotRunning
    raise error_cls.for_run(run, answer.detail or answer.code)
