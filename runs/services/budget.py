"""Budgets (DESIGN §2, §13): a run past its time, tool-call, cost or token budget is stopped
through the stop path, by the enforcer, at the permit that would exceed it, or (cost and
tokens) by the events batch whose usage reaches it.
"""

from __future__ import annotations

from datetime import datetime
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

# The run budgets a stop with reason budget_exhausted may name, in the order they are checked.
BUDGET_NAMES = ("max_cost_usd", "max_tokens", "max_tool_calls")


def exhausted_spend_budget(run: Run) -> str:
    """ "max_cost_usd" or "max_tokens" when that budget is used up, else "".

    Used up at 100 %: spending exactly the budget leaves nothing to spend. Reads only the
    columns the events batch loads with its lock.
    """
    if run.max_cost_usd is not None and run.cost_usd >= run.max_cost_usd:
        return "max_cost_usd"
    if run.max_tokens is not None and run.input_tokens + run.output_tokens >= run.max_tokens:
        return "max_tokens"
    return ""


def exhausted_budget(run: Run, *, adding_tool_call: bool = False) -> str:
    """The name of the run's budget that is used up (see BUDGET_NAMES), or "": cost and tokens
    at 100 %, tool calls when one more would exceed the budget."""
    if spent := exhausted_spend_budget(run):
        return spent
    if (
        run.max_tool_calls is not None
        and run.tool_calls_count + (1 if adding_tool_call else 0) > run.max_tool_calls
    ):
        return "max_tool_calls"
    return ""


def budget_note(run: Run, budget: str) -> str:
    """What the stop request's note says about the budget that stopped the run."""
    used: Any
    limit: Any
    if budget == "max_cost_usd":
        used, limit = f"{run.cost_usd:f} USD", f"{run.max_cost_usd:f} USD"
    elif budget == "max_tokens":
        used, limit = f"{run.input_tokens + run.output_tokens} tokens", f"{run.max_tokens}"
    else:
        used, limit = f"{run.tool_calls_count} tool calls", f"{run.max_tool_calls}"
    return f"budget {budget} exhausted: {used} of {limit}"


def budget_from_note(note: str) -> str:
    """The budget a `budget_note` names ("" for any other note)."""
    words = note.split()
    if len(words) >= 3 and words[0] == "budget" and words[2].rstrip(":") == "exhausted":
        return words[1] if words[1] in BUDGET_NAMES else ""
    return ""


def _budget_exceeded(run: Run, *, now: datetime, adding_tool_call: bool = False) -> str:
    if exhausted_budget(run, adding_tool_call=adding_tool_call):
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
        budget = exhausted_budget(run)
        note = budget_note(run, budget) if budget else "budget enforcer"
        return _stop_locked(run, reason=reason, note=note, actor=Actor.system("budget"), now=now)


def runs_over_budget_ids() -> list[str]:
    """Candidates for the budget enforcer (the enforcer re-checks each under its lock)."""
    running = Run.objects.filter(status=RunStatus.RUNNING).filter(
        Q(max_seconds__isnull=False)
        | Q(max_tool_calls__isnull=False)
        | Q(max_cost_usd__isnull=False)
        | Q(max_tokens__isnull=False)
    )
    now = timezone.now()
    ids = []
    for run in running.only(
        "id",
        "max_seconds",
        "max_tool_calls",
        "tool_calls_count",
        "started_at",
        "max_cost_usd",
        "max_tokens",
        "cost_usd",
        "input_tokens",
        "output_tokens",
    ):
        if _budget_exceeded(run, now=now):
            ids.append(run.pk)
    return ids
