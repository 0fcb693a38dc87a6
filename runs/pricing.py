"""What a model call cost (DESIGN §13): the provider's own figure, else the team's own price
for the model, else the price table.

The table is the one the `genai-prices` package bundles, read from the installed package only:
its background refresh (`genai_prices.UpdatePrices`) is never started, so pricing makes no
network call and a running server's prices change only with the package. Each price keeps the
table's version, so a stored cost can always be traced to the prices that made it, and a newer
package never rewrites it.

A team's price (`TeamPrice`, set by its admins) comes before the table: it is there for models
the table lacks (Qwen, Doubao, a private deployment) or for a rate the team negotiated. Its
version is `team:<id>:v<n>`, so a row priced by it names the exact price that made it.

An unknown model (or a provider the table does not know) is *unpriced*: its cost is None, never
$0, so a total that leaves it out can say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import genai_prices

from runs.models import PriceSource, TeamPrice

TABLE_VERSION = f"genai-prices {genai_prices.__version__}"


@dataclass(frozen=True)
class Price:
    cost_usd: Decimal | None
    source: str  # a PriceSource
    version: str  # the table's version; blank when the table was not used


_PER_TOKEN = Decimal(1_000_000)


class TeamPrices:
    """One team's own prices, read once (per events batch, per reprice) and looked up per call:
    the price naming the call's provider first, then the one for any provider."""

    def __init__(self, prices: list[TeamPrice]) -> None:
        self._by_key = {(price.model, price.provider): price for price in prices}

    @classmethod
    def for_team(cls, team_id: int) -> TeamPrices:
        return cls(list(TeamPrice.objects.filter(team_id=team_id)))

    def find(self, model: str, provider: str) -> TeamPrice | None:
        if not self._by_key:
            return None
        return self._by_key.get((model, provider)) or self._by_key.get((model, ""))


NO_TEAM_PRICES = TeamPrices([])


def team_price_version(price: TeamPrice) -> str:
    return f"team:{price.pk}:v{price.version}"


def team_price_cost(
    price: TeamPrice,
    *,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_write_tokens: int,
) -> Decimal:
    """`input_tokens` counts every input token, cached or not (as the table does): the cached
    ones are priced at their own rate when the team gave one, else as plain input."""
    plain = input_tokens - cache_read_tokens - cache_write_tokens
    cache_read = price.cache_read_usd_per_mtok
    cache_write = price.cache_write_usd_per_mtok
    total = (
        plain * price.input_usd_per_mtok
        + cache_read_tokens * (price.input_usd_per_mtok if cache_read is None else cache_read)
        + cache_write_tokens * (price.input_usd_per_mtok if cache_write is None else cache_write)
        + output_tokens * price.output_usd_per_mtok
    )
    return total / _PER_TOKEN


def price_call(
    *,
    model: str,
    provider: str,
    input_tokens: int,
    output_tokens: int,
    cache_read_tokens: int,
    cache_write_tokens: int,
    reported_cost_usd: Decimal | None,
    at: datetime,
    team_prices: TeamPrices = NO_TEAM_PRICES,
) -> Price:
    """The cost of one call at `at` (the call's time: the table knows when prices changed)."""
    if reported_cost_usd is not None:
        return Price(reported_cost_usd, PriceSource.PROVIDER, "")
    own = team_prices.find(model, provider)
    if own is not None:
        cost = team_price_cost(
            own,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cache_read_tokens=cache_read_tokens,
            cache_write_tokens=cache_write_tokens,
        )
        return Price(cost, PriceSource.TEAM, team_price_version(own))
    try:
        calculation = genai_prices.calc_price(
            genai_prices.Usage(
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cache_read_tokens=cache_read_tokens,
                cache_write_tokens=cache_write_tokens,
            ),
            model_ref=model,
            provider_id=provider or None,
            genai_request_timestamp=at,
        )
    except LookupError:  # no such model, or no such provider, in the table
        return Price(None, PriceSource.UNPRICED, TABLE_VERSION)
    return Price(Decimal(calculation.total_price), PriceSource.TABLE, TABLE_VERSION)
