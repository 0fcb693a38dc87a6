"""The fields of a `usage` event (DESIGN §13): one model call's tokens, named as OpenTelemetry's
`gen_ai.usage.*` attributes name them. `AgentRun.report_usage` sends them.

Checked here what would otherwise cost more than this event: a NaN or infinite cost cannot be
written as JSON, and the server would refuse the whole request it travels in.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any


def usage_fields(
    *,
    model: str,
    input_tokens: int,
    output_tokens: int,
    provider: str | None = None,
    cache_read_tokens: int | None = None,
    cache_write_tokens: int | None = None,
    cost_usd: float | Decimal | None = None,
    step_key: str | None = None,
) -> dict[str, Any]:
    """`input_tokens` counts every input token, cached ones included; `cost_usd` only when the
    provider reported what the call cost (it then wins over the server's price table)."""
    if not model:
        raise ValueError("usage needs a model")
    if cost_usd is not None:
        if not math.isfinite(cost_usd):
            raise ValueError(f"cost_usd must be a finite number, not {cost_usd!r}")
        # A Decimal travels as its exact text; the server reads numbers and numeric strings.
        cost: Any = str(cost_usd) if isinstance(cost_usd, Decimal) else cost_usd
    fields: dict[str, Any] = {
        "model": model,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }
    optional = {
        "provider": provider,
        "cache_read_tokens": cache_read_tokens,
        "cache_write_tokens": cache_write_tokens,
        "cost_usd": cost if cost_usd is not None else None,
        "step_key": step_key,
    }
    fields.update({key: value for key, value in optional.items() if value is not None})
    return fields
