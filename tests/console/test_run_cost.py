"""The run page shows what the run spent: the total, the tokens, what is unpriced, by model."""

from __future__ import annotations

from decimal import Decimal

import pytest

from console.templatetags.console_tags import usd
from runs import services
from tests.support.scenarios import AGENT, new_run, start

pytestmark = pytest.mark.django_db


def test_the_run_page_shows_cost_tokens_unpriced_and_by_model(as_viewer, team):
    run = new_run(team, max_cost_usd=Decimal("5"))
    start(run)
    services.events_ingest(
        run_id=run.pk,
        epoch=1,
        actor=AGENT,
        events=[
            {
                "event_id": "a",
                "type": "usage",
                "model": "gpt-4o",
                "input_tokens": 1000,
                "output_tokens": 100,
                "cost_usd": 0.5,
            },
            {
                "event_id": "b",
                "type": "usage",
                "model": "gpt-4o",
                "input_tokens": 10,
                "output_tokens": 1,
                "cost_usd": 0.25,
            },
            {
                "event_id": "c",
                "type": "usage",
                "model": "acme-llm-9000",
                "input_tokens": 40,
                "output_tokens": 2,
            },
        ],
    )
    body = as_viewer.get(f"/runs/{run.pk}/").content.decode()
    assert "$0.75" in body and "/ $5.00" in body
    assert "42 tokens unpriced" in body
    assert "1153" in body  # tokens, input + output
    table = body.split('data-testid="run-cost-by-model"')[1].split("</table>")[0]
    assert "gpt-4o" in table and "acme-llm-9000" in table
    assert "unpriced" in table.split("acme-llm-9000")[1].split("</tr>")[0]


def test_a_run_without_usage_shows_no_cost_table(as_viewer, team):
    run = new_run(team)
    body = as_viewer.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="run-cost"' in body
    assert 'data-testid="run-cost-by-model"' not in body


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("0"), "$0.00"),
        (Decimal("0.0035000000"), "$0.0035"),
        (Decimal("0.5"), "$0.50"),
        (Decimal("1234.5"), "$1,234.50"),
        (Decimal("0.0000001"), "<$0.000001"),
        (None, "—"),
    ],
)
def test_usd_never_rounds_a_cost_to_zero(value, text):
    assert usd(value) == text


def test_the_packet_page_shows_spend_up_to_the_stop_and_late_spend(as_viewer, team):
    run = new_run(team, max_tokens=100)
    lease = start(run)

    def spend(event_id: str, tokens: int, cost: float) -> None:
        services.events_ingest(
            run_id=run.pk,
            epoch=1,
            actor=AGENT,
            events=[
                {
                    "event_id": event_id,
                    "type": "usage",
                    "model": "gpt-4o",
                    "input_tokens": tokens,
                    "output_tokens": 0,
                    "cost_usd": cost,
                }
            ],
        )

    spend("a", 100, 0.5)  # reaches the token budget: the run is stopped
    spend("late", 7, 0.25)
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
    )
    body = as_viewer.get(f"/runs/{run.pk}/packet/", follow=True).content.decode()
    cost = body.split('data-testid="packet-cost"')[1].split("</div>")[0]
    assert "$0.50" in cost and "100 tokens" in cost and "budget max_tokens (100) exhausted" in cost
    late = body.split('data-testid="packet-late-spend"')[1].split("</div>")[0]
    assert "$0.25" in late and "7 tokens" in late
