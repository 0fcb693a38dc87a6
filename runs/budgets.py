"""Budgets (DESIGN §2, §13) as facts: which of a run's budgets is used up and the note a stop
names it in; a team budget's periods (days and months in the team's time zone) and what its
counters say in one. Pure functions of a `Run` or a `TeamBudget`; the stops they lead to are
`runs.services.budget` (the enforcer and the permit), the events batch and
`runs.services.team_budgets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo

from runs.models import Run, StopReason, TeamBudget

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


# A team's budgets (runs.services.team_budgets) write notes of the same shape.
TEAM_BUDGET_NAMES = ("team_daily_usd", "team_monthly_usd")


def budget_from_note(note: str) -> str:
    """The budget a `budget_note` (or a team budget's note) names ("" for any other note)."""
    words = note.split()
    if len(words) >= 3 and words[0] == "budget" and words[2].rstrip(":") == "exhausted":
        return words[1] if words[1] in BUDGET_NAMES + TEAM_BUDGET_NAMES else ""
    return ""


def budget_limit_from_note(note: str) -> Decimal | None:
    """The limit a budget note names ("... of 10 USD ..."): a team budget's limit is not on the
    run, and the admin may have changed it since."""
    words = note.split()
    for index, word in enumerate(words[:-1]):
        if word == "of":
            try:
                return Decimal(words[index + 1])
            except InvalidOperation:
                return None
    return None


def budget_exceeded(run: Run, *, now: datetime, adding_tool_call: bool = False) -> str:
    if exhausted_budget(run, adding_tool_call=adding_tool_call):
        return StopReason.BUDGET_EXHAUSTED
    if run.max_seconds is not None and run.started_at is not None:
        if (now - run.started_at).total_seconds() > run.max_seconds:
            return StopReason.TIMEOUT
    return ""


# --------------------------------------------------------------------------------------------
# a team's budgets: its periods, and what its counters say in one

DAILY, MONTHLY = TEAM_BUDGET_NAMES


@dataclass(frozen=True)
class Period:
    day: date
    month: date  # its first day


def period_at(time_zone: str, now: datetime) -> Period:
    local = now.astimezone(ZoneInfo(time_zone)).date()
    return Period(local, local.replace(day=1))


def team_budget_roll(budget: TeamBudget, period: Period) -> None:
    """Move the counters to `period`: a new day or month starts at zero."""
    if budget.day != period.day:
        budget.day, budget.day_spent_usd = period.day, Decimal(0)
    if budget.month != period.month:
        budget.month, budget.month_spent_usd = period.month, Decimal(0)


def team_budget_states(
    budget: TeamBudget,
) -> list[tuple[str, Decimal | None, Decimal, date | None, date | None]]:
    return [
        (DAILY, budget.daily_usd, budget.day_spent_usd, budget.day, budget.day_warned),
        (MONTHLY, budget.monthly_usd, budget.month_spent_usd, budget.month, budget.month_warned),
    ]


def team_budget_note(budget: TeamBudget, name: str) -> str:
    """The stop request's note (`budget.budget_from_note` reads the name back)."""
    if name == DAILY:
        spent, limit, period = budget.day_spent_usd, budget.daily_usd, f"day {budget.day}"
    else:
        spent, limit = budget.month_spent_usd, budget.monthly_usd
        period = f"month {budget.month:%Y-%m}" if budget.month else "month"
    limit_text = "no limit" if limit is None else f"{limit.normalize():f}"
    return (
        f"budget {name} exhausted: {spent.normalize():f} USD of {limit_text} USD "
        f"({period}, {budget.time_zone})"
    )
