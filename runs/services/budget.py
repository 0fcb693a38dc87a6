"""Budgets (DESIGN §2): a run past its time or tool-call budget is stopped through the
stop path, by the enforcer or at the permit that would exceed it.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.utils import timezone

from runs.actors import Actor
from runs.models import (
    Run,
    RunStatus,
    StopReason,
    StopRequest,
)
from runs.services._base import (
    locked_run,
)
from runs.services.lifecycle import _stop_locked


def _budget_exceeded(run: Run, *, now: Any, adding_tool_call: bool = False) -> str:
    if (
        run.max_tool_calls is not None
        and run.tool_calls_count + (1 if adding_tool_call else 0) > run.max_tool_calls
    ):
        return StopReason.BUDGET_EXHAUSTED
    if run.max_seconds is not None and run.started_at is not None:
        if (now - run.started_at).total_seconds() > run.max_seconds:
            return StopReason.TIMEOUT
    return ""


def run_enforce_budget(*, run_id: str) -> StopRequest | None:
    """Budget enforcer: a running run past its budget is stopped through the same stop path."""
    with locked_run(run_id) as run:
        if run.status != RunStatus.RUNNING:
            return None
        now = timezone.now()
        reason = _budget_exceeded(run, now=now)
        if not reason:
            return None
        return _stop_locked(
            run, reason=reason, note="budget enforcer", actor=Actor.system("budget"), now=now
        )


def runs_over_budget_ids() -> list[str]:
    """Candidates for the budget enforcer (the enforcer re-checks each under its lock)."""
    running = Run.objects.filter(status=RunStatus.RUNNING).filter(
        Q(max_seconds__isnull=False) | Q(max_tool_calls__isnull=False)
    )
    now = timezone.now()
    ids = []
    for run in running.only(
        "id", "max_seconds", "max_tool_calls", "tool_calls_count", "started_at"
    ):
        if _budget_exceeded(run, now=now):
            ids.append(run.pk)
    return ids
