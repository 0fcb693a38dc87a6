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
from typing import Any

import genai_prices
import genai_prices.data_snapshot

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
    usage = genai_prices.Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cache_read_tokens=cache_read_tokens,
        cache_write_tokens=cache_write_tokens,
    )
    try:
        found, info = _SNAPSHOT.find_provider_model(model, None, provider or None, None)
    except LookupError:  # no such model, or no such provider, in the table
        return Price(None, PriceSource.UNPRICED, TABLE_VERSION)
    rates = _flat_rates(found, info, at)
    if rates is None:
        total = Decimal(info.calc_price(usage, found, genai_request_timestamp=at).total_price)
    else:
        total = rates.cost(input_tokens, output_tokens, cache_read_tokens, cache_write_tokens)
    return Price(total, PriceSource.TABLE, TABLE_VERSION)


# The bundled table only: `UpdatePrices` never runs, so the snapshot is the package's.
_SNAPSHOT = genai_prices.data_snapshot.get_snapshot()


@dataclass(frozen=True)
class FlatRates:
    """USD per token of a price with no tiers: the table's own figures, read once per price.

    `genai_prices.calc_price` costs about 0.6 ms a call (it resolves the price's units every
    time), more than the rest of a usage event's work; a price without tiers is linear in the
    token counts, so its per-token rates (and any fee per call), taken from the table's own
    calculation, give the same figure (tests/api/test_pricing_rates.py checks every model of
    the table)."""

    request: Decimal  # per call, whatever its tokens (some providers charge one)
    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal

    def cost(
        self, input_tokens: int, output_tokens: int, cache_read: int, cache_write: int
    ) -> Decimal:
        plain = input_tokens - cache_read - cache_write
        return (
            self.request
            + plain * self.input
            + cache_read * self.cache_read
            + cache_write * self.cache_write
            + output_tokens * self.output
        )


_MTOK = 1_000_000
# id(ModelPrice) -> (the price, its rates or None): the table's price objects live as long as
# the process, and the price is kept here so its id cannot be reused.
_RATES: dict[int, tuple[Any, FlatRates | None]] = {}


def flat_rates_for(model: str, provider: str, at: datetime) -> FlatRates | None:
    """The per-token rates the table's price for `model` has at `at` (None: it has tiers, or
    the table's own calculation is used for another reason)."""
    found, info = _SNAPSHOT.find_provider_model(model, None, provider or None, None)
    return _flat_rates(found, info, at)


def _flat_rates(found: Any, info: Any, at: datetime) -> FlatRates | None:
    model_price = info.get_prices(at)
    cached = _RATES.get(id(model_price))
    if cached is not None and cached[0] is model_price:
        return cached[1]
    rates = _rates_of(found, info, model_price, at)
    _RATES[id(model_price)] = (model_price, rates)
    return rates


def _rates_of(found: Any, info: Any, model_price: Any, at: datetime) -> FlatRates | None:
    """The per-token rates, or None when the price has tiers (or anything else than plain
    figures), or the table cannot price one of the four counts alone: then every call goes
    through the table's own calculation."""
    if not all(value is None or isinstance(value, Decimal) for value in vars(model_price).values()):
        return None

    def price(**counts: int) -> Decimal:
        usage = genai_prices.Usage(**counts)
        return Decimal(info.calc_price(usage, found, genai_request_timestamp=at).total_price)

    try:
        request = price()

        def per_token(**counts: int) -> Decimal:
            return price(**counts) - request

        return FlatRates(
            request=request,
            input=per_token(input_tokens=_MTOK) / _MTOK,
            output=per_token(output_tokens=_MTOK) / _MTOK,
            cache_read=per_token(input_tokens=_MTOK, cache_read_tokens=_MTOK) / _MTOK,
            cache_write=per_token(input_tokens=_MTOK, cache_write_tokens=_MTOK) / _MTOK,
        )
    except Exception:  # noqa: BLE001 - any refusal of a probe: use the table's calculation
        return None
