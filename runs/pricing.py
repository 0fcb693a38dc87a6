"""What a model call cost (DESIGN §13): the provider's own figure, else the price table.

The table is the one the `genai-prices` package bundles, read from the installed package only:
its background refresh (`genai_prices.UpdatePrices`) is never started, so pricing makes no
network call and a running server's prices change only with the package. Each price keeps the
table's version, so a stored cost can always be traced to the prices that made it, and a newer
package never rewrites it.

An unknown model (or a provider the table does not know) is *unpriced*: its cost is None, never
$0, so a total that leaves it out can say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import genai_prices

from runs.models import PriceSource

TABLE_VERSION = f"genai-prices {genai_prices.__version__}"


@dataclass(frozen=True)
class Price:
    cost_usd: Decimal | None
    source: str  # a PriceSource
    version: str  # the table's version; blank when the table was not used


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
) -> Price:
    """The cost of one call at `at` (the call's time: the table knows when prices changed)."""
    if reported_cost_usd is not None:
        return Price(reported_cost_usd, PriceSource.PROVIDER, "")
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
