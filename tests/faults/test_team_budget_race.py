"""Many runs on one team budget (DESIGN §13), on PostgreSQL: 20 runs in 20 threads each ask a
permit and then report the call's usage, as fast as they can, until the team's budget refuses
them. The overspend is bounded by the calls already in flight when the budget was reached: at
most one call per run (its permit was granted before the budget was used up), so less than
20 calls' worth. The test prints the overspend it measured.
"""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connection, connections

from runs import services
from runs.actors import Actor
from runs.errors import BudgetExhausted, RunNotRunning, StaleEpoch
from runs.models import Run, RunStatus, StopRequest, TeamBudget, Usage
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 20
CALL_USD = Decimal("0.01")
BUDGET_USD = Decimal("1.00")  # 100 calls
AGENT = Actor.system("race-agent")


def test_twenty_runs_on_one_team_budget_overspend_at_most_the_calls_in_flight(team):
    assert connection.vendor == "postgresql", "the race is about PostgreSQL's row locks"
    services.team_budget_set(
        team_id=team.pk, actor=AGENT, time_zone="UTC", daily_usd=BUDGET_USD, monthly_usd=None
    )
    runs = [make_running(team)[0] for _ in range(RUNS)]
    start = threading.Barrier(RUNS)
    refusals: dict[str, str] = {}
    errors: list[BaseException] = []

    def agent(run: Run) -> None:
        try:
            start.wait(10)
            for call in range(1000):
                try:
                    services.permit_request(
                        run_id=run.pk,
                        epoch=1,
                        tool_call_id=f"call-{call}",
                        tool="search",
                        actor=AGENT,
                    )
                except (BudgetExhausted, RunNotRunning, StaleEpoch) as refused:
                    refusals[run.pk] = refused.code
                    return
                # The model call the permit let through: its usage arrives whatever happened
                # meanwhile (late spend, when a stop came first).
                services.events_ingest(
                    run_id=run.pk,
                    epoch=1,
                    actor=AGENT,
                    events=[
                        {
                            "event_id": f"usage-{call}",
                            "type": "usage",
                            "model": "gpt-4o",
                            "input_tokens": 100,
                            "output_tokens": 10,
                            "cost_usd": str(CALL_USD),
                        }
                    ],
                )
        except BaseException as error:  # surfaced below, not lost in the thread
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=agent, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)

    spent = sum(Usage.objects.filter(run__team=team).values_list("cost_usd", flat=True))
    budget = TeamBudget.objects.get(pk=team.pk)
    assert budget.day_spent_usd == spent  # the counter is exactly the rows' sum
    overspend = spent - BUDGET_USD
    calls_over = overspend / CALL_USD
    print(
        f"\nteam budget race: {RUNS} runs, budget {BUDGET_USD} USD, {CALL_USD} USD a call: "
        f"spent {spent} USD, overspend {overspend} USD = {calls_over} calls "
        f"(bound: fewer than {RUNS} calls in flight)"
    )
    assert spent >= BUDGET_USD  # the budget was reached: refusals are not early
    assert calls_over < RUNS  # at most one call in flight per run when it was reached
    # Every run ended refused and stopped with budget_exhausted, naming a team budget.
    assert len(refusals) == RUNS
    # A run its own usage stopped is refused as stale (its epoch moved on); one that asked a
    # permit after the budget was used up gets budget_exhausted. Which of the two a run meets
    # depends on where it was when the budget ran out: under contention every thread may be
    # waiting on the budget row with a permit in hand, so all of them can end stale.
    assert set(refusals.values()) <= {"budget_exhausted", "stale_epoch", "run_not_running"}
    for run in Run.objects.filter(pk__in=[run.pk for run in runs]):
        assert run.status != RunStatus.RUNNING
        assert run.stop_reason == "budget_exhausted"
        note = StopRequest.objects.get(run=run).note
        assert note.startswith("budget team_daily_usd exhausted"), note
    # A run that starts after the race is refused at its first permit, naming the budget.
    late, _lease = make_running(team)
    with pytest.raises(BudgetExhausted) as refused:
        services.permit_request(
            run_id=late.pk, epoch=1, tool_call_id="call-late", tool="search", actor=AGENT
        )
    assert "team" in str(refused.value)
