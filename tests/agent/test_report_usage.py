"""`run.report_usage(...)`: one `usage` event per model call, at the lease's epoch."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from agent_fakes import FakeApi

from safestop_agent import AgentRun, SafestopClient


def leased(client: SafestopClient) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", push=False, heartbeat_interval=3600)


def test_usage_is_sent_as_one_event_with_the_open_step(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run, run.step("plan", "Plan", kind="tool_read"):
        answer = run.report_usage(
            model="gpt-4o",
            provider="openai",
            input_tokens=1200,
            output_tokens=80,
            cache_read_tokens=1000,
        )
        run.report_usage(
            model="claude-x",
            input_tokens=5,
            output_tokens=1,
            cost_usd=Decimal("0.0001"),
            step_key="other",
        )
    assert answer["status"] == "accepted"
    first, second = fake_api.events_of_type("usage")
    assert first["event_id"].startswith("evt_")
    assert {k: v for k, v in first.items() if k not in ("event_id", "type")} == {
        "model": "gpt-4o",
        "provider": "openai",
        "input_tokens": 1200,
        "output_tokens": 80,
        "cache_read_tokens": 1000,
        "step_key": "plan",
    }
    assert (second["cost_usd"], second["step_key"]) == ("0.0001", "other")
    assert fake_api.sent("events/")[-2]["epoch"] == 3


@pytest.mark.parametrize("cost", [math.nan, math.inf, -math.inf])
def test_a_cost_json_cannot_carry_is_refused_before_sending(
    client: SafestopClient, fake_api: FakeApi, cost: float
) -> None:
    with leased(client) as run:
        with pytest.raises(ValueError, match="finite"):
            run.report_usage(model="gpt-4o", input_tokens=1, output_tokens=1, cost_usd=cost)
    assert fake_api.events_of_type("usage") == []
