"""Pricing stored usage again (DESIGN §13): what the current price table and team prices would
change, and, only when asked, the change itself, ledgered.

A stored cost never changes by itself: the events batch prices a row once, and a newer
`genai-prices` package or a changed team price only shows here. A provider-reported cost is
the provider's own figure and is never repriced.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs.actors import Actor
from runs.budgets import period_at
from runs.ledger import ledger_append
from runs.models import PriceSource, TeamBudget, Usage
from runs.pricing import TeamPrices, price_call
from runs.services._base import locked_run
from runs.services.team_budgets import recount

_COST_PLACES = Decimal("1e-10")  # Usage.cost_usd's scale
_BATCH = 2000


@dataclass(frozen=True)
class Repricing:
    """One stored row whose price would change."""

    usage_id: int
    run_id: str
    team_id: int
    model: str
    old_cost: Decimal | None
    new_cost: Decimal | None
    old_source: str
    new_source: str
    old_version: str
    new_version: str


def _rows(team_id: int | None) -> Iterator[Usage]:
    rows = Usage.objects.exclude(price_source=PriceSource.PROVIDER).select_related("run")
    if team_id is not None:
        rows = rows.filter(run__team_id=team_id)
    return rows.order_by("pk").iterator(chunk_size=_BATCH)


def reprice_plan(*, team_id: int | None = None) -> list[Repricing]:
    """Every stored row (not provider-priced) whose cost, source or version the current table
    and team prices would change. Reads only."""
    prices: dict[int, TeamPrices] = {}
    changes = []
    for row in _rows(team_id):
        team = row.run.team_id
        if team not in prices:
            prices[team] = TeamPrices.for_team(team)
        price = price_call(
            model=row.model,
            provider=row.provider,
            input_tokens=row.input_tokens,
            output_tokens=row.output_tokens,
            cache_read_tokens=row.cache_read_tokens,
            cache_write_tokens=row.cache_write_tokens,
            reported_cost_usd=None,
            at=row.at,
            team_prices=prices[team],
        )
        new_cost = None if price.cost_usd is None else price.cost_usd.quantize(_COST_PLACES)
        if (new_cost, price.source, price.version) != (
            row.cost_usd,
            row.price_source,
            row.price_version,
        ):
            changes.append(
                Repricing(
                    usage_id=row.pk,
                    run_id=row.run_id,
                    team_id=team,
                    model=row.model,
                    old_cost=row.cost_usd,
                    new_cost=new_cost,
                    old_source=row.price_source,
                    new_source=price.source,
                    old_version=row.price_version,
                    new_version=price.version,
                )
            )
    return changes


def reprice_summary(changes: Iterable[Repricing]) -> list[dict[str, Any]]:
    """Per model: rows, the old and new total, and how many rows become or stop being
    unpriced."""
    by_model: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"rows": 0, "old": Decimal(0), "new": Decimal(0), "priced": 0, "unpriced": 0}
    )
    for change in changes:
        line = by_model[change.model]
        line["rows"] += 1
        line["old"] += change.old_cost or 0
        line["new"] += change.new_cost or 0
        line["priced"] += change.old_cost is None and change.new_cost is not None
        line["unpriced"] += change.old_cost is not None and change.new_cost is None
    return [{"model": model, **line} for model, line in sorted(by_model.items())]


def reprice_apply(changes: list[Repricing], *, actor: Actor) -> int:
    """Write the changes run by run, each under its run lock with a `usage.repriced` ledger
    entry (every row's old and new cost, source and version), and move the run's totals and
    the team budget's counters with them. Returns the rows written. A row changed since the
    plan was read is left alone (the plan is re-checked under the lock)."""
    by_run: dict[str, list[Repricing]] = defaultdict(list)
    for change in changes:
        by_run[change.run_id].append(change)
    written = 0
    teams: set[int] = set()
    for run_id, run_changes in by_run.items():
        written += _apply_run(run_id, run_changes, actor=actor)
        teams.add(run_changes[0].team_id)
    for team_id in teams:
        _recount_team(team_id)
    return written


def _apply_run(run_id: str, changes: list[Repricing], *, actor: Actor) -> int:
    with locked_run(run_id) as run:
        rows = Usage.objects.in_bulk([change.usage_id for change in changes])
        done = []
        for change in changes:
            row = rows.get(change.usage_id)
            if row is None or (row.cost_usd, row.price_source, row.price_version) != (
                change.old_cost,
                change.old_source,
                change.old_version,
            ):
                continue
            tokens = row.input_tokens + row.output_tokens
            run.cost_usd += (change.new_cost or 0) - (change.old_cost or 0)
            if change.old_cost is None and change.new_cost is not None:
                run.unpriced_tokens -= tokens
            elif change.old_cost is not None and change.new_cost is None:
                run.unpriced_tokens += tokens
            row.cost_usd = change.new_cost
            row.price_source, row.price_version = change.new_source, change.new_version
            done.append(row)
        if not done:
            return 0
        Usage.objects.bulk_update(done, ["cost_usd", "price_source", "price_version"])
        run.save(update_fields=["cost_usd", "unpriced_tokens"])
        by_id = {change.usage_id: change for change in changes}
        ledger_append(
            run=run,
            actor=actor,
            action="usage.repriced",
            payload={
                "rows": [
                    {
                        "event_id": row.event_id,
                        "model": row.model,
                        "old": [
                            _text(by_id[row.pk].old_cost),
                            by_id[row.pk].old_source,
                            by_id[row.pk].old_version,
                        ],
                        "new": [_text(row.cost_usd), row.price_source, row.price_version],
                    }
                    for row in done
                ]
            },
        )
    return len(done)


def _text(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def _recount_team(team_id: int) -> None:
    """The team budget's counters follow the rows (counted again under its row lock)."""
    with transaction.atomic():
        budget = TeamBudget.objects.select_for_update().filter(pk=team_id).first()
        if budget is not None:
            recount(budget, period_at(budget.time_zone, timezone.now()))
            budget.save(update_fields=["day", "day_spent_usd", "month", "month_spent_usd"])
