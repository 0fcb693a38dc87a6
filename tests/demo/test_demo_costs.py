"""The demo shows cost within a minute: its agents report each model call's usage, priced from
the table (several real models), by the team's own price (`qwen-max`) or not at all (an unknown
model: unpriced, never $0), and one run's model calls reach its cost budget, which stops it."""

from __future__ import annotations

import pytest

from console.demo.accounts import demo_accounts_ensure
from console.demo.simulator import APPROVAL_SCENARIOS, SCENARIOS, Simulator, SimulatorConfig
from runs.models import Run, StopRequest, TeamBudget, Usage
from tests.support.demo import LIVE, run_statuses, team_credentials
from tests.support.stack import wait_until

FIRST_MINUTE = 60  # seconds; the simulator runs at a quarter of its real pace here


def _usage(run_ids: list[str]):
    return Usage.objects.filter(run_id__in=run_ids)


@pytest.mark.django_db(transaction=True)
def test_the_demo_shows_costs_an_unpriced_model_and_a_budget_stop_in_the_first_minute(
    stack, receiver
):
    demo_accounts_ensure()
    simulator = Simulator(
        SimulatorConfig(
            url=stack.url,
            teams=team_credentials(),
            receiver_url=receiver.url(""),
            concurrency=len(SCENARIOS),
            pace=0.25,
            reviewer_interval=0,  # no reviewer bot: the budget, not a person, stops the run
            approval_workers=len(APPROVAL_SCENARIOS),
            approval_grace=0.5,
            seed=5,
        )
    )
    assert simulator.wait_until_ready(10)
    simulator.start()
    try:
        wait_until(
            lambda: Run.objects.filter(
                pk__in=simulator.run_ids, agent="summary-bot", stop_reason="budget_exhausted"
            ).exists(),
            timeout=FIRST_MINUTE,
            what="the contract summariser stopped by its cost budget",
        )
        wait_until(
            lambda: (
                {"table", "team", "unpriced"}
                <= set(_usage(simulator.run_ids).values_list("price_source", flat=True))
            ),
            timeout=FIRST_MINUTE,
            what="usage priced by the table, by a team price, and unpriced",
        )
    finally:
        simulator.stop(timeout=15)
    usage = _usage(simulator.run_ids)
    priced_models = set(usage.filter(price_source="table").values_list("model", flat=True))
    assert len(priced_models) >= 2, priced_models  # a few real model names
    assert usage.filter(price_source="table", cost_usd__gt=0).exists()
    team_priced = usage.filter(price_source="team").first()
    assert team_priced is not None and team_priced.model == "qwen-max"
    assert team_priced.price_version.startswith("team:")
    unpriced = usage.filter(price_source="unpriced").first()
    assert unpriced is not None and unpriced.model == "doubao-pro-32k"
    assert unpriced.cost_usd is None  # never $0
    assert Run.objects.get(pk=unpriced.run_id).unpriced_tokens > 0
    stopped = Run.objects.filter(
        pk__in=simulator.run_ids, agent="summary-bot", stop_reason="budget_exhausted"
    ).first()
    assert stopped is not None and stopped.cost_usd >= stopped.max_cost_usd
    note = StopRequest.objects.filter(run=stopped).first().note
    assert note.startswith("budget max_cost_usd exhausted")
    # The payments team's daily budget counts its priced spend.
    assert TeamBudget.objects.get(team__slug="payments").day_spent_usd > 0
    wait_until(
        lambda: not [s for s in run_statuses(simulator.run_ids).values() if s in LIVE],
        timeout=15,
        what="the simulator's runs to settle",
    )
