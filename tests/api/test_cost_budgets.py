"""Run cost and token budgets stop the run (DESIGN §13); the stop packet tells the spend up to
the stop from the spend reported after it (late spend) and names the budget."""

from __future__ import annotations

from decimal import Decimal

import pytest

from runs import selectors, services
from runs.models import Run, StopRequest
from tests.support.api import url
from tests.support.scenarios import SYSTEM

pytestmark = pytest.mark.django_db


def usage(event_id: str, **fields):
    return {"event_id": event_id, "type": "usage", "model": "gpt-4o", **fields}


def send(api, run_id, token, *events, epoch: int = 1):
    response = api.post(url(run_id, "events/"), {"epoch": epoch, "events": list(events)}, token)
    assert response.status_code == 200, response.content
    return [(a["status"], a.get("code")) for a in response.json()["results"]]


def create_running(api, token, budget):
    response = api.post(
        "/api/v1/runs/", {"title": "Costly", "agent": "spender", "budget": budget}, token
    )
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    lease = api.post(url(run_id, "lease/"), {"worker_id": "w1"}, token).json()
    return run_id, lease


def test_reaching_the_cost_budget_stops_the_run_budget_exhausted(api, team, agent_token):
    run_id, _ = create_running(api, agent_token, {"max_cost_usd": "0.01"})
    assert api.get(url(run_id), agent_token).json()["budget"]["max_cost_usd"] == 0.01
    send(api, run_id, agent_token, usage("u1", input_tokens=10, output_tokens=1, cost_usd=0.006))
    assert api.get(url(run_id), agent_token).json()["status"] == "running"
    answers = send(
        api, run_id, agent_token, usage("u2", input_tokens=10, output_tokens=1, cost_usd=0.004)
    )
    assert answers == [("accepted", None)]  # the call that reached the budget is still counted
    detail = api.get(url(run_id), agent_token).json()
    assert detail["status"] == "cancel_requested"
    assert detail["stop_reason"] == "budget_exhausted"
    assert detail["cost_usd"] == 0.01
    stop_request = StopRequest.objects.get(run_id=run_id)
    assert (stop_request.requested_by, stop_request.actor_kind) == ("budget", "system")
    assert stop_request.note.startswith("budget max_cost_usd exhausted")
    # The entrance is closed: the stopped run's worker gets no permit.
    permit = api.post(
        url(run_id, "permits/"),
        {"epoch": 1, "tool_call_id": "c1", "tool": "search", "side_effect": "none"},
        agent_token,
    )
    assert permit.status_code == 409


def test_reaching_the_token_budget_stops_the_run_and_the_packet_names_it(api, team, agent_token):
    run_id, lease = create_running(api, agent_token, {"max_tokens": 1000})
    send(api, run_id, agent_token, usage("u1", input_tokens=600, output_tokens=300))
    assert reload_status(run_id) == "running"
    send(api, run_id, agent_token, usage("u2", input_tokens=90, output_tokens=10))
    assert reload_status(run_id) == "cancel_requested"
    # Reported after the stop request: late spend, still counted on the run.
    send(api, run_id, agent_token, usage("late", input_tokens=400, output_tokens=100, cost_usd=1))
    send(
        api, run_id, agent_token, usage("late2", model="acme-llm", input_tokens=5, output_tokens=5)
    )
    drained = api.post(
        url(run_id, "drained/"),
        {"lease_id": lease["lease_id"], "epoch": lease["epoch"], "observations": []},
        agent_token,
    )
    assert drained.status_code == 200, drained.content
    packet = api.get(url(run_id, "stop-packet/"), agent_token).json()
    assert packet["stop_reason"] == "budget_exhausted"
    cost = packet["cost"]
    assert cost["budget"] == {"name": "max_tokens", "limit": 1000}
    assert cost["tokens_until_stop"] == 1000
    assert cost["unpriced_tokens_until_stop"] == 0
    assert cost["cost_usd_until_stop"] > 0
    assert (cost["late_cost_usd"], cost["late_tokens"], cost["late_unpriced_tokens"]) == (
        1.0,
        510,
        10,
    )
    by_model = {row["model"]: row for row in cost["by_model"]}
    assert by_model["acme-llm"] == {
        "model": "acme-llm",
        "calls": 1,
        "cost_usd": 0.0,
        "input_tokens": 5,
        "output_tokens": 5,
        "unpriced_tokens": 10,
    }
    assert by_model["gpt-4o"]["calls"] == 3
    assert by_model["gpt-4o"]["input_tokens"] == 1090
    run = api.get(url(run_id), agent_token).json()
    assert run["tokens"]["total"] == 1510
    assert run["unpriced_tokens"] == 10


def reload_status(run_id: str) -> str:
    return Run.objects.get(pk=run_id).status


def test_a_user_stop_packet_has_no_budget_and_splits_the_spend(api, team, agent_token):
    run_id, lease = create_running(api, agent_token, {})
    send(api, run_id, agent_token, usage("u1", input_tokens=10, output_tokens=1, cost_usd=0.25))
    services.run_stop(run_id=run_id, reason="user_stop", actor=SYSTEM)
    send(api, run_id, agent_token, usage("u2", input_tokens=10, output_tokens=1, cost_usd=0.5))
    api.post(url(run_id, "drained/"), lease_body_of(lease), agent_token)
    cost = api.get(url(run_id, "stop-packet/"), agent_token).json()["cost"]
    assert cost["budget"] is None
    assert (cost["cost_usd_until_stop"], cost["late_cost_usd"]) == (0.25, 0.5)
    assert Run.objects.get(pk=run_id).cost_usd == Decimal("0.75")


def lease_body_of(lease):
    return {"lease_id": lease["lease_id"], "epoch": lease["epoch"], "observations": []}


def test_the_budget_enforcer_names_a_cost_budget_it_finds_exhausted(team):
    """A run over a cost budget it reached while it was not running (so no batch stopped it)
    is found by the enforcer and stopped naming the budget."""
    run = services.run_create(
        team=team, title="t", agent="a", actor=SYSTEM, max_cost_usd=Decimal("1")
    )
    services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=30, actor=SYSTEM)
    Run.objects.filter(pk=run.pk).update(cost_usd=Decimal("1.5"))
    assert selectors.runs_over_budget_ids() == [run.pk]
    stop_request = services.run_enforce_budget(run_id=run.pk)
    assert stop_request is not None
    assert stop_request.reason == "budget_exhausted"
    assert stop_request.note == "budget max_cost_usd exhausted: 1.5000000000 USD of 1.000000 USD"


@pytest.mark.parametrize(
    "budget",
    [{"max_cost_usd": 0}, {"max_cost_usd": "-1"}, {"max_cost_usd": "NaN"}, {"max_tokens": 0}],
)
def test_a_bad_budget_is_a_400(api, agent_token, budget):
    response = api.post(
        "/api/v1/runs/", {"title": "t", "agent": "a", "budget": budget}, agent_token
    )
    assert response.status_code == 400
