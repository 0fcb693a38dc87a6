"""The table price of a call is the `genai-prices` package's own figure: the per-token rates
`runs.pricing` keeps for a price without tiers give the same cost as the package's calculation,
for every model of the bundled table, with and without cached tokens."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import genai_prices
import genai_prices.data_snapshot

from runs.pricing import FlatRates, flat_rates_for, price_call

AT = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PLACES = Decimal("1e-10")  # Usage.cost_usd's scale
COUNTS = [
    (1_000, 100, 0, 0),
    (123_457, 9_876, 40_000, 0),
    (5_000, 0, 1_000, 2_000),
    (7, 3, 0, 0),
]


def _table_models():
    snapshot = genai_prices.data_snapshot.get_snapshot()
    for provider in snapshot.providers:
        for model in provider.models:
            yield provider, model


def test_every_table_model_prices_as_the_package_does():
    compared = fast = 0
    for provider, model in _table_models():
        for input_tokens, output_tokens, cache_read, cache_write in COUNTS:
            try:
                expected = Decimal(
                    genai_prices.calc_price(
                        genai_prices.Usage(
                            input_tokens=input_tokens,
                            output_tokens=output_tokens,
                            cache_read_tokens=cache_read,
                            cache_write_tokens=cache_write,
                        ),
                        model_ref=model.id,
                        provider_id=provider.id,
                        genai_request_timestamp=AT,
                    ).total_price
                )
            except Exception:  # noqa: BLE001 - the package cannot price it: nothing to compare
                continue
            price = price_call(
                model=model.id,
                provider=provider.id,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                cache_read_tokens=cache_read,
                cache_write_tokens=cache_write,
                reported_cost_usd=None,
                at=AT,
            )
            assert price.source == "table", (provider.id, model.id)
            assert price.cost_usd is not None
            assert price.cost_usd.quantize(PLACES) == expected.quantize(PLACES), (
                provider.id,
                model.id,
                (input_tokens, output_tokens, cache_read, cache_write),
            )
            compared += 1
            fast += isinstance(flat_rates_for(model.id, provider.id, AT), FlatRates)
    assert compared > 1000  # the whole table, not a handful
    assert fast > compared // 2  # most prices take the per-token path


def test_common_models_take_the_per_token_path():
    for model, provider in [("gpt-4o", "openai"), ("gpt-4o-mini", "openai")]:
        rates = flat_rates_for(model, provider, AT)
        assert isinstance(rates, FlatRates), model
        assert rates.input > 0 and rates.output > rates.input
    # A price with tiers (by context length) goes through the package's own calculation.
    assert flat_rates_for("claude-sonnet-4-5", "anthropic", AT) is None
