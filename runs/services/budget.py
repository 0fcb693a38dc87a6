"""Budgets (DESIGN §2, §13): a run past its time, tool-call, cost or token budget is stopped
through the stop path, by the enforcer, at the permit that would exceed it, or (cost and
tokens) by the events batch whose usage reaches it. Which budget is used up is `runs.budgets`.
"""

from __future__ import annotations

from django.utils import timezone

from runs.actors import Actor
from runs.budgets import (
    BUDGET_NAMES,
    TEAM_BUDGET_NAMES,
    budget_exceeded,
    budget_from_note,
    budget_limit_from_note,
    budget_note,
    exhausted_budget,
    exhausted_spend_budget,
)
from runs.models import RunStatus, StopRequest
from runs.services._base import locked_run
from runs.services.lifecycle import stop_locked

# What handoff and the other services read from here (defined in `runs.budgets`).
__all__ = [
    "BUDGET_NAMES",
    "TEAM_BUDGET_NAMES",
    "budget_exceeded",
    "budget_from_note",
    "budget_limit_from_note",
    "budget_note",
    "exhausted_budget",
    "exhausted_spend_budget",
    "run_enforce_budget",
]


def run_enforce_budget(*, run_id: str) -> StopRequest | None:
    """Budget enforcer: a running run past its budget is stopped through the same stop path."""
    with locked_run(run_id) as run:
        if run.status != RunStatus.RUNNING:
            return None
        now = timezone.now()
        reason = budget_exceeded(run, now=now)
        if not reason:
            return None
        budget = exhausted_budget(run)
        note = budget_note(run, budget) if budget else "budget enforcer"
        return stop_locked(run, reason=reason, note=note, actor=Actor.system("budget"), now=now)
