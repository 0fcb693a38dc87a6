"""Moves a worker makes through events, as one call each, for tests that need a run in a given
state: complete, fail, suspend (each one `runs.services.events_ingest` event). A lost worker
(an interruption) is `tests.support.scenarios.run_interrupt`."""

from __future__ import annotations

import secrets
from typing import Any

from runs.actors import Actor
from runs.errors import RunNotRunning, StaleEpoch
from runs.models import Run
from runs.services import EventAnswer, events_ingest


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
