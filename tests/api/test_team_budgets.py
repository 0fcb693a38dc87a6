"""A team's daily and monthly budgets (DESIGN §13): set by its admins (API and console, ledgered),
counted in the team's time zone, 80 % warns once per period through the notification channels,
100 % stops the run that reached it and refuses the team's permits until an admin raises it."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from notifications import services as notify
from notifications.models import Delivery
from runs import selectors, services
from runs.actors import Actor
from runs.errors import InvalidInput
from runs.models import LedgerEntry, Run, StopRequest, TeamBudget
from tests.support.api import lease_body, url
from tests.support.scenarios import SYSTEM, make_running

pytestmark = pytest.mark.django_db

ADMIN = Actor.system("test-admin")


def usage(event_id: str, cost: str, **fields):
    return {
        "event_id": event_id,
        "type": "usage",
        "model": "gpt-4o",
        "input_tokens": 10,
        "output_tokens": 1,
        "cost_usd": cost,
        **fields,
    }


def send(api, run, token, *events):
    response = api.post(url(run, "events/"), {"epoch": 1, "events": list(events)}, token)
    assert response.status_code == 200, response.content
    return [(a["status"], a.get("code")) for a in response.json()["results"]]


def permit(api, run, token, call_id: str):
    return api.post(
        url(run, "permits/"),
        {"epoch": 1, "tool_call_id": call_id, "tool": "search", "side_effect": "none"},
        token,
    )


def test_an_admin_sets_the_budget_through_the_api_and_the_ledger_keeps_it(
    api, client, team, alice, bob
):
    client.force_login(alice)
    answer = api.client.put(
        f"/api/v1/teams/{team.slug}/budget/",
        data={"time_zone": "Asia/Shanghai", "daily_usd": "5", "monthly_usd": 100},
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["time_zone"], body["daily_usd"], body["monthly_usd"]) == (
        "Asia/Shanghai",
        5.0,
        100.0,
    )
    assert body["exhausted"] == ""
    entry = LedgerEntry.objects.get(action="team_budget.changed")
    assert entry.payload["before"] == {"time_zone": "UTC", "daily_usd": None, "monthly_usd": None}
    assert entry.payload["after"]["daily_usd"] == "5.000000"
    assert entry.actor == "alice"
    # A reviewer reads it but may not set it.
    client.force_login(bob)
    assert api.get(f"/api/v1/teams/{team.slug}/budget/").json()["daily_usd"] == 5.0
    refused = api.client.put(
        f"/api/v1/teams/{team.slug}/budget/",
        data={"daily_usd": 50},
        content_type="application/json",
    )
    assert refused.status_code == 403


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"time_zone": "Mars/Olympus"}, "time_zone"),
        ({"daily_usd": -1}, "daily_usd"),
        ({"daily_usd": "NaN"}, "daily_usd"),
        ({"monthly_usd": 0}, "monthly_usd"),
        ({"weekly_usd": 3}, "weekly_usd"),
    ],
)
def test_a_bad_budget_is_a_400_naming_the_field(api, client, team, alice, body, field):
    client.force_login(alice)
    answer = api.client.put(
        f"/api/v1/teams/{team.slug}/budget/", data=body, content_type="application/json"
    )
    assert answer.status_code == 400, answer.content
    assert field in answer.content.decode()
    assert not LedgerEntry.objects.filter(action="team_budget.changed").exists()


def test_80_percent_warns_through_the_channels_once_per_period(api, team, agent_token):
    notify.channel_create(
        team=team, name="ops", kind="email", target="ops@example.com", actor=ADMIN
    )
    services.team_budget_set(
        team_id=team.pk, actor=ADMIN, time_zone="UTC", daily_usd="10", monthly_usd=None
    )
    run, _ = make_running(team)
    send(api, run, agent_token, usage("u1", "7.99"))
    assert not LedgerEntry.objects.filter(action="budget.warning").exists()
    send(api, run, agent_token, usage("u2", "0.01"))  # 8.00 of 10: 80 %
    other, _ = make_running(team)
    send(api, other, agent_token, usage("u3", "0.5"))  # still 80 %+ in the same day: no repeat
    warnings = LedgerEntry.objects.filter(action="budget.warning")
    assert warnings.count() == 1
    assert warnings[0].payload["budget"] == "team_daily_usd"
    assert warnings[0].payload["spent_usd"] == "8"
    deliveries = Delivery.objects.filter(event="budget.warning")
    assert deliveries.count() == 1
    assert "80 %" in deliveries[0].message["title"]
    assert Run.objects.get(pk=run.pk).status == "running"


def test_100_percent_stops_the_run_names_the_budget_and_refuses_the_teams_permits(
    api, client, team, alice, agent_token
):
    services.team_budget_set(
        team_id=team.pk, actor=ADMIN, time_zone="Europe/Paris", daily_usd=None, monthly_usd="1"
    )
    spender, lease = make_running(team)
    bystander, _ = make_running(team)
    assert permit(api, bystander, agent_token, "before").status_code == 201
    assert send(api, spender, agent_token, usage("u1", "0.6"), usage("u2", "0.4")) == [
        ("accepted", None),
        ("accepted", None),
    ]
    spender = Run.objects.get(pk=spender.pk)
    assert (spender.status, spender.stop_reason) == ("cancel_requested", "budget_exhausted")
    note = StopRequest.objects.get(run=spender).note
    assert note.startswith("budget team_monthly_usd exhausted: 1 USD of 1 USD")
    # The other run of the team gets no new permit: 409 budget_exhausted naming the budget,
    # and it is stopped through the stop path too.
    refused = permit(api, bystander, agent_token, "after")
    assert refused.status_code == 409, refused.content
    assert refused.json()["error"] == "budget_exhausted"
    assert refused.json()["budget"] == "team_monthly_usd"
    assert Run.objects.get(pk=bystander.pk).stop_reason == "budget_exhausted"
    # A new run of the team too, until an admin raises the budget.
    fresh, _ = make_running(team)
    assert permit(api, fresh, agent_token, "c1").status_code == 409
    client.force_login(alice)
    raised = api.client.put(
        f"/api/v1/teams/{team.slug}/budget/",
        data={"time_zone": "Europe/Paris", "monthly_usd": 5},
        content_type="application/json",
    )
    assert raised.status_code == 200
    assert raised.json()["month_spent_usd"] == 1.0  # counted from the usage rows
    later, _ = make_running(team)
    assert permit(api, later, agent_token, "c2").status_code == 201
    # The packet of the stopped run names the team budget and its limit then.
    drained = api.post(url(spender, "drained/"), lease_body(lease, observations=[]), agent_token)
    assert drained.status_code == 200, drained.content
    packet = api.get(url(spender, "stop-packet/"), agent_token).json()
    assert packet["cost"]["budget"]["name"] == "team_monthly_usd"
    assert packet["cost"]["budget"]["limit"] == 1.0


def test_days_and_months_are_counted_in_the_teams_time_zone(team):
    services.team_budget_set(
        team_id=team.pk, actor=ADMIN, time_zone="Asia/Shanghai", daily_usd="1", monthly_usd="3"
    )
    run, _ = make_running(team)
    # 15:30 UTC on 3 December is 23:30 in Shanghai: still the 3rd there.
    late_evening = datetime(2026, 12, 3, 15, 30, tzinfo=UTC)
    with services.locked_run(run.pk) as locked:
        charge = services.team_budget_charge(locked, Decimal("1"), now=late_evening)
    assert charge is not None and charge.exhausted == "team_daily_usd"
    assert selectors.team_budget_refusal(team.pk, now=late_evening)[0] == "team_daily_usd"
    # 16:30 UTC is past midnight in Shanghai: a new day, while the month still counts.
    after_midnight = datetime(2026, 12, 3, 16, 30, tzinfo=UTC)
    assert selectors.team_budget_refusal(team.pk, now=after_midnight) == ("", "")
    with services.locked_run(run.pk) as locked:
        charge = services.team_budget_charge(locked, Decimal("0.5"), now=after_midnight)
    budget = TeamBudget.objects.get(pk=team.pk)
    assert (budget.day.isoformat(), budget.day_spent_usd) == ("2026-12-04", Decimal("0.5"))
    assert budget.month_spent_usd == Decimal("1.5")
    # A new month in Shanghai starts the monthly counter at zero.
    next_month = datetime(2026, 12, 31, 16, 1, tzinfo=UTC)
    with services.locked_run(run.pk) as locked:
        services.team_budget_charge(locked, Decimal("0.25"), now=next_month)
    budget = TeamBudget.objects.get(pk=team.pk)
    assert (budget.month.isoformat(), budget.month_spent_usd) == ("2027-01-01", Decimal("0.25"))


def test_a_team_without_a_budget_is_never_refused(api, team, agent_token):
    run, _ = make_running(team)
    send(api, run, agent_token, usage("u1", "9000"))
    assert permit(api, run, agent_token, "c1").status_code == 201
    assert not TeamBudget.objects.exists()


def test_unpriced_usage_does_not_count_as_zero_spend_nor_as_spend(api, team, agent_token):
    services.team_budget_set(
        team_id=team.pk, actor=SYSTEM, time_zone="UTC", daily_usd="1", monthly_usd=None
    )
    run, _ = make_running(team)
    send(api, run, agent_token, usage("u1", None, model="acme-unknown-llm"))
    budget = TeamBudget.objects.get(pk=team.pk)
    assert budget.day_spent_usd == 0
    assert Run.objects.get(pk=run.pk).unpriced_tokens == 11


def test_the_service_refuses_a_bad_time_zone(team):
    with pytest.raises(InvalidInput, match="not an IANA time zone"):
        services.team_budget_set(
            team_id=team.pk, actor=ADMIN, time_zone="Nowhere/Land", daily_usd=1, monthly_usd=None
        )
