"""A team's daily and monthly budgets (DESIGN §13), and its own model prices.

The events batch adds what its usage cost to the team's counters (`team_budget_charge`), under
the budget row's lock and in the batch's own transaction: many runs on one budget count into
one total, so at most the calls already in flight when it is reached spend past it. At 80 % of
a budget the run whose usage crossed it writes `budget.warning` to the ledger (the
notification channels deliver it), once per budget and period; at 100 % that batch stops its
run with `budget_exhausted`, and every permit the team asks for is refused with
`409 budget_exhausted` (`team_budget_refusal`) until an admin raises the budget or the period
ends. Periods are days and months in the team's time zone.

Lock order: a run, then the team's budget row; nothing takes a run lock while holding it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import connection, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from runs import sql
from runs.actors import Actor
from runs.budgets import (
    DAILY,
    Period,
    period_at,
    team_budget_note,
    team_budget_roll,
    team_budget_states,
)
from runs.errors import InvalidInput, NotFound
from runs.ledger import ledger_append
from runs.models import Run, Team, TeamBudget, TeamPrice, Usage

# A read, kept importable from here for the console's budgets page (console/views/budgets.py).

WARN_AT = Decimal("0.8")
# A budget above this is a typo, not a budget (the column holds 14 digits, 6 after the point).
MAX_BUDGET_USD = Decimal(100_000_000)
MAX_PRICE_USD_PER_MTOK = Decimal(100_000)


@dataclass
class Charge:
    """What one batch's spend did to its team's budgets."""

    exhausted: str = ""  # DAILY or MONTHLY, when one is used up
    note: str = ""  # the stop request's note naming it
    warnings: list[dict[str, Any]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# the events batch's hook


_CHARGE_FIELDS = (
    "time_zone",
    "daily_usd",
    "monthly_usd",
    "day",
    "day_spent_usd",
    "month",
    "month_spent_usd",
    "day_warned",
    "month_warned",
)


@functools.cache
def _charge_statement() -> str:
    """One statement: the counters move to the current period (a new day or month starts at
    zero) and add the batch's spend; the row lock it takes is held to the batch's commit."""
    day, month, zone = (sql.column(TeamBudget, name) for name in ("day", "month", "time_zone"))
    day_spent, month_spent = (
        sql.column(TeamBudget, "day_spent_usd"),
        sql.column(TeamBudget, "month_spent_usd"),
    )
    local = f"(%(now)s::timestamptz AT TIME ZONE {zone})"
    return (
        f"UPDATE {sql.table(TeamBudget)} SET "
        f"{day_spent} = CASE WHEN {day} = {local}::date THEN {day_spent} ELSE 0 END + %(amount)s, "
        f"{day} = {local}::date, "
        f"{month_spent} = CASE WHEN {month} = date_trunc('month', {local})::date "
        f"THEN {month_spent} ELSE 0 END + %(amount)s, "
        f"{month} = date_trunc('month', {local})::date "
        f"WHERE {sql.column(TeamBudget, 'team')} = %(team)s "
        f"RETURNING {', '.join(sql.column(TeamBudget, name) for name in _CHARGE_FIELDS)}"
    )


def team_budget_charge(run: Run, amount_usd: Decimal, *, now: datetime) -> Charge | None:
    """Add a batch's priced spend to the run's team budget; call it under the run lock, in the
    batch's transaction. None when the team has no budget. Writes the 80 % warnings (ledger
    `budget.warning` on this run); the caller stops the run when `exhausted` is set."""
    budget = _charged(run.team_id, amount_usd, now)
    if budget is None:
        return None
    charge = Charge()
    warned: dict[str, date] = {}
    for name, limit, spent, period, warned_for in team_budget_states(budget):
        if limit is None or period is None:
            continue
        if spent >= limit and not charge.exhausted:
            charge.exhausted = name
            charge.note = team_budget_note(budget, name)
        if spent >= limit * WARN_AT and warned_for != period:
            warned[name] = period
            charge.warnings.append(
                {
                    "budget": name,
                    "limit_usd": str(limit),
                    "spent_usd": str(spent.normalize()),
                    "period": period.isoformat(),
                    "time_zone": budget.time_zone,
                }
            )
    if warned:
        TeamBudget.objects.filter(pk=run.team_id).update(
            **{
                ("day_warned" if name == DAILY else "month_warned"): on
                for name, on in warned.items()
            }
        )
        for warning in charge.warnings:
            ledger_append(
                run=run,
                actor=Actor.system("budget"),
                action="budget.warning",
                reason=warning["budget"],
                payload=warning,
            )
    return charge


def _charged(team_id: int, amount: Decimal, now: datetime) -> TeamBudget | None:
    if sql.prepared_statements():
        with connection.cursor() as cursor:
            cursor.execute(_charge_statement(), {"now": now, "amount": amount, "team": team_id})
            row = cursor.fetchone()
        if row is None:
            return None
        return TeamBudget(team_id=team_id, **dict(zip(_CHARGE_FIELDS, row, strict=True)))
    budget = TeamBudget.objects.select_for_update().filter(pk=team_id).first()
    if budget is None:
        return None
    team_budget_roll(budget, period_at(budget.time_zone, now))
    budget.day_spent_usd += amount
    budget.month_spent_usd += amount
    budget.save(update_fields=["day", "day_spent_usd", "month", "month_spent_usd"])
    return budget


# --------------------------------------------------------------------------------------------
# the admins' writes


def validate_time_zone(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(
            "time_zone: name an IANA time zone, e.g. Europe/Paris", field="time_zone"
        )
    name = value.strip()
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"time_zone: {name[:64]!r} is not an IANA time zone (e.g. Asia/Shanghai)",
            field="time_zone",
        ) from None
    return name


def validate_usd(
    value: Any, name: str, *, maximum: Decimal, allow_none: bool = True, allow_zero: bool = False
) -> Any:
    """A positive amount of USD with at most 6 decimals, or None (no limit) when allowed."""
    if value is None or value == "":
        if allow_none:
            return None
        raise InvalidInput(f"{name} is required", field=name)
    if isinstance(value, bool) or not isinstance(value, int | float | str | Decimal):
        raise InvalidInput(f"{name} must be a number of USD", field=name)
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        raise InvalidInput(f"{name} must be a number of USD", field=name) from None
    if not amount.is_finite():
        raise InvalidInput(f"{name} must be a finite number", field=name)
    if amount < 0 or (amount == 0 and not allow_zero):
        raise InvalidInput(f"{name} must be more than 0", field=name)
    if amount > maximum:
        raise InvalidInput(f"{name} must be at most {maximum}", field=name)
    if amount != amount.quantize(Decimal("0.000001")):
        raise InvalidInput(f"{name} has more than 6 decimal places", field=name)
    return amount


def _budget_snapshot(budget: TeamBudget) -> dict[str, Any]:
    return {
        "time_zone": budget.time_zone,
        "daily_usd": None if budget.daily_usd is None else str(budget.daily_usd),
        "monthly_usd": None if budget.monthly_usd is None else str(budget.monthly_usd),
    }


def team_budget_set(
    *, team_id: int, actor: Actor, time_zone: Any, daily_usd: Any, monthly_usd: Any
) -> TeamBudget:
    """Set (or clear, with None) the team's budgets; the ledger keeps the old and new values
    (`team_budget.changed`). The current day's and month's spend is counted from the usage
    rows, so a budget set mid-month knows what the month has already cost. A limit that
    changes may warn again in the same period: the warning is about the new limit."""
    time_zone = validate_time_zone(time_zone)
    daily = validate_usd(daily_usd, "daily_usd", maximum=MAX_BUDGET_USD)
    monthly = validate_usd(monthly_usd, "monthly_usd", maximum=MAX_BUDGET_USD)
    with transaction.atomic():
        team = Team.objects.filter(pk=team_id).first()
        if team is None:
            raise NotFound(f"team {team_id} does not exist")
        TeamBudget.objects.get_or_create(team=team)
        budget = TeamBudget.objects.select_for_update().get(pk=team.pk)
        before = _budget_snapshot(budget)
        if (budget.daily_usd, budget.time_zone) != (daily, time_zone):
            budget.day_warned = None
        if (budget.monthly_usd, budget.time_zone) != (monthly, time_zone):
            budget.month_warned = None
        budget.time_zone, budget.daily_usd, budget.monthly_usd = time_zone, daily, monthly
        budget.updated_by = actor.name
        recount(budget, period_at(time_zone, timezone.now()))
        budget.save()
        after = _budget_snapshot(budget)
        if after != before:
            ledger_append(
                run=None,
                actor=actor,
                action="team_budget.changed",
                team_slug=team.slug,
                payload={"before": before, "after": after},
            )
    return budget


def recount(budget: TeamBudget, period: Period) -> None:
    """The period's spend from the usage rows (under the budget row's lock, so no batch adds
    to the counters meanwhile)."""
    zone = ZoneInfo(budget.time_zone)
    month_start = datetime(period.month.year, period.month.month, 1, tzinfo=zone)
    day_start = datetime(period.day.year, period.day.month, period.day.day, tzinfo=zone)
    rows = Usage.objects.filter(run__team_id=budget.team_id, at__gte=month_start)
    totals = rows.aggregate(
        month=Sum("cost_usd"),
        day=Sum("cost_usd", filter=Q(at__gte=day_start)),
    )
    budget.day, budget.month = period.day, period.month
    budget.day_spent_usd = totals["day"] or Decimal(0)
    budget.month_spent_usd = totals["month"] or Decimal(0)


# --------------------------------------------------------------------------------------------
# the team's own prices

PRICE_FIELDS = (
    "input_usd_per_mtok",
    "output_usd_per_mtok",
    "cache_read_usd_per_mtok",
    "cache_write_usd_per_mtok",
)


def _price_snapshot(price: TeamPrice) -> dict[str, Any]:
    return {
        "model": price.model,
        "provider": price.provider,
        "version": price.version,
        **{
            name: None if getattr(price, name) is None else str(getattr(price, name))
            for name in PRICE_FIELDS
        },
    }


def _clean_price(fields: dict[str, Any]) -> dict[str, Any]:
    clean: dict[str, Any] = {}
    for name in ("model", "provider"):
        value = fields.get(name, "")
        if not isinstance(value, str):
            raise InvalidInput(f"{name} must be a string", field=name)
        limit = 200 if name == "model" else 100
        if len(value.strip()) > limit:
            raise InvalidInput(f"{name} is longer than {limit} characters", field=name)
        clean[name] = value.strip()
    if not clean["model"]:
        raise InvalidInput("model is required", field="model")
    for name in PRICE_FIELDS:
        required = name in PRICE_FIELDS[:2]
        # 0 is a price (a model the team runs itself), unlike a missing one.
        clean[name] = validate_usd(
            fields.get(name),
            name,
            maximum=MAX_PRICE_USD_PER_MTOK,
            allow_none=not required,
            allow_zero=True,
        )
    return clean


def team_price_set(*, team_id: int, actor: Actor, **fields: Any) -> TeamPrice:
    """Create or change the team's price for one model (and provider); the version grows with
    each change, and the ledger keeps the old and new price (`team_price.changed`). Stored
    costs stay as they were: `manage.py reprice` shows, and writes when asked, what changes."""
    clean = _clean_price(fields)
    with transaction.atomic():
        team = Team.objects.filter(pk=team_id).first()
        if team is None:
            raise NotFound(f"team {team_id} does not exist")
        price = (
            TeamPrice.objects.select_for_update()
            .filter(team=team, model=clean["model"], provider=clean["provider"])
            .first()
        )
        before = None if price is None else _price_snapshot(price)
        if price is None:
            price = TeamPrice(team=team, **clean)
        else:
            changed = any(getattr(price, name) != clean[name] for name in PRICE_FIELDS)
            if not changed:
                return price
            for name in PRICE_FIELDS:
                setattr(price, name, clean[name])
            price.version += 1
        price.updated_by = actor.name
        price.save()
        ledger_append(
            run=None,
            actor=actor,
            action="team_price.changed",
            team_slug=team.slug,
            payload={"price_id": price.pk, "before": before, "after": _price_snapshot(price)},
        )
    return price


def team_price_delete(*, price_id: int, actor: Actor) -> None:
    """Remove a team price; rows it priced keep their cost and version."""
    with transaction.atomic():
        price = (
            TeamPrice.objects.select_for_update().select_related("team").filter(pk=price_id).first()
        )
        if price is None:
            raise NotFound(f"team price {price_id} does not exist")
        ledger_append(
            run=None,
            actor=actor,
            action="team_price.deleted",
            team_slug=price.team.slug,
            payload={"price_id": price.pk, "before": _price_snapshot(price)},
        )
        price.delete()
