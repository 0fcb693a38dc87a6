"""Cost in the console beyond the run's own totals: the runs page's cost and tokens columns
(sortable), the run page's cost by step, the stop quality page's late spend, and the team
budgets and prices page (admins)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from console.access import Access
from console.selectors.runs import RunFilters, runs_page
from runs import services
from runs.models import LedgerEntry, TeamBudget, TeamPrice
from tests.support.scenarios import AGENT, SYSTEM, new_run, start

pytestmark = pytest.mark.django_db


def spend(run, *calls):
    services.events_ingest(
        run_id=run.pk,
        epoch=run.stop_epoch,
        actor=AGENT,
        events=[
            {
                "event_id": f"{run.pk}-{model}-{step}-{index}",
                "type": "usage",
                "model": model,
                "input_tokens": tokens,
                "output_tokens": 0,
                **({"cost_usd": cost} if cost is not None else {}),
                **({"step_key": step} if step else {}),
            }
            for index, (model, tokens, cost, step) in enumerate(calls)
        ],
    )


def running(team, title):
    run = new_run(team, title=title)
    start(run)
    run.refresh_from_db()
    return run


def rows_order(body: str, titles: list[str]) -> list[str]:
    return sorted(titles, key=body.index)


def test_the_runs_page_shows_cost_and_tokens_and_sorts_by_them(as_viewer, team):
    cheap = running(team, "Cheap run")
    dear = running(team, "Dear run")
    wordy = running(team, "Wordy run")
    spend(cheap, ("gpt-4o", 10, "0.01", ""))
    spend(dear, ("gpt-4o", 20, "2.5", ""))
    spend(wordy, ("acme-unknown", 5000, None, ""))
    titles = ["Cheap run", "Dear run", "Wordy run"]
    newest = as_viewer.get("/").content.decode()
    assert rows_order(newest, titles) == ["Wordy run", "Dear run", "Cheap run"]
    assert "$2.50" in newest and "$0.01" in newest
    assert "+ unpriced" in newest  # the wordy run's cost is not all known
    by_cost = as_viewer.get("/?sort=cost").content.decode()
    assert rows_order(by_cost, titles) == ["Dear run", "Cheap run", "Wordy run"]
    assert 'aria-sort="descending"' in by_cost
    by_tokens = as_viewer.get("/?sort=tokens").content.decode()
    assert rows_order(by_tokens, titles) == ["Wordy run", "Dear run", "Cheap run"]
    assert ">5000<" in by_tokens


def test_the_runs_page_sorted_by_cost_pages_on(as_viewer, team):
    runs = [running(team, f"Run {n}") for n in range(5)]
    for n, run in enumerate(runs):
        spend(run, ("gpt-4o", 1, str(n + 1), ""))
    everything = Access(user_id=None, all_teams=True)
    pages = []
    cursor = ""
    while True:
        page = runs_page(everything, RunFilters(sort="cost", after=cursor), teams=[team], size=2)
        pages.append([run.title for run in page.rows])
        if not page.has_older:
            break
        cursor = page.older_cursor
    assert pages == [["Run 4", "Run 3"], ["Run 2", "Run 1"], ["Run 0"]]
    # A tampered cursor is the first page, never a 500.
    assert as_viewer.get("/?sort=cost&after=not-a-cursor").status_code == 200
    assert as_viewer.get("/?sort=nonsense").status_code == 200


def test_the_run_page_shows_cost_by_step(as_viewer, team):
    run = running(team, "Stepped")
    # One batch per step, in the order the steps ran: the table lists steps in that order.
    spend(run, ("gpt-4o", 100, "0.25", "plan"))
    spend(run, ("gpt-4o", 100, "0.5", "write"), ("acme-unknown", 7, None, "write"))
    spend(run, ("gpt-4o", 1, "0.125", ""))
    body = as_viewer.get(f"/runs/{run.pk}/").content.decode()
    table = body.split('data-testid="run-cost-by-step"')[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    assert ["plan" in rows[0], "write" in rows[1], "no step" in rows[2]] == [True, True, True]
    assert "$0.25" in rows[0]
    assert "$0.50" in rows[1] and "7 tokens unpriced" in rows[1]
    assert "$0.125" in rows[2]


def test_the_quality_page_shows_the_late_spend_after_stop_requests(as_viewer, team):
    run = running(team, "Stopped while spending")
    spend(run, ("gpt-4o", 100, "1", ""))
    services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM)
    services.events_ingest(
        run_id=run.pk,
        epoch=1,  # the stopped epoch's call, reported after the stop request
        actor=AGENT,
        events=[
            {
                "event_id": "late",
                "type": "usage",
                "model": "gpt-4o",
                "input_tokens": 40,
                "output_tokens": 2,
                "cost_usd": "0.75",
            }
        ],
    )
    body = as_viewer.get("/quality/").content.decode()
    figure = body.split('data-testid="quality-late-spend"')[1].split("</article>")[0]
    assert "$0.75" in figure
    assert "1 model call" in figure and "1 run" in figure
    assert "42 tokens reported after the stop request" in figure


def test_the_budgets_page_is_for_admins_and_sets_a_budget_ledgered(as_admin, as_reviewer, team):
    assert as_reviewer.get("/budgets/").status_code == 403
    assert as_admin.get("/budgets/").status_code == 200
    saved = as_admin.post(
        "/budgets/",
        {"team": team.slug, "time_zone": "Asia/Shanghai", "daily_usd": "12.5", "monthly_usd": ""},
    )
    assert saved.status_code == 302
    budget = TeamBudget.objects.get(pk=team.pk)
    assert (budget.time_zone, budget.daily_usd, budget.monthly_usd) == (
        "Asia/Shanghai",
        Decimal("12.5"),
        None,
    )
    assert LedgerEntry.objects.filter(action="team_budget.changed", actor="alice").exists()
    bad = as_admin.post(
        "/budgets/", {"team": team.slug, "time_zone": "Mars/Base", "daily_usd": "1"}
    )
    assert bad.status_code == 400
    assert "not an IANA time zone" in bad.content.decode()
    page = as_admin.get("/budgets/").content.decode()
    assert "$12.50" in page


def test_the_budgets_page_sets_and_removes_a_team_price(as_admin, team):
    saved = as_admin.post(
        "/budgets/prices/",
        {
            "team": team.slug,
            "model": "qwen-max",
            "provider": "",
            "input_usd_per_mtok": "1.6",
            "output_usd_per_mtok": "6.4",
        },
    )
    assert saved.status_code == 302
    price = TeamPrice.objects.get(team=team, model="qwen-max")
    assert (price.input_usd_per_mtok, price.output_usd_per_mtok) == (Decimal("1.6"), Decimal("6.4"))
    assert "qwen-max" in as_admin.get("/budgets/").content.decode()
    refused = as_admin.post(
        "/budgets/prices/", {"team": team.slug, "model": "doubao-pro", "input_usd_per_mtok": "x"}
    )
    assert refused.status_code == 400
    assert "input_usd_per_mtok must be a number" in refused.content.decode()
    removed = as_admin.post(f"/budgets/prices/{price.pk}/delete/")
    assert removed.status_code == 302
    assert not TeamPrice.objects.exists()
    assert LedgerEntry.objects.filter(action="team_price.deleted").count() == 1
