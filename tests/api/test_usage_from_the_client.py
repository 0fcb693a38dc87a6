"""The Python client's `report_usage` against the real events endpoint (through Django's test
client, no live server): the call is priced, totalled, and a budget it reaches stops the run."""

from __future__ import annotations

from decimal import Decimal

import httpx
import pytest
from django.test import Client

from runs.models import Run, Usage
from safestop_agent import AgentRun, SafestopClient

pytestmark = pytest.mark.django_db


def bridge(client: Client, token) -> SafestopClient:
    def handle(request: httpx.Request) -> httpx.Response:
        response = client.generic(
            request.method,
            request.url.raw_path.decode(),
            request.content,
            content_type=request.headers.get("content-type", "application/json"),
            HTTP_AUTHORIZATION=request.headers["authorization"],
        )
        return httpx.Response(
            response.status_code,
            content=response.content,
            headers={"content-type": response["Content-Type"]},
        )

    return SafestopClient("http://testserver", token.raw, transport=httpx.MockTransport(handle))


def test_report_usage_is_priced_and_its_budget_stops_the_run(client, agent_token):
    api = bridge(client, agent_token)
    run_id = api.create_run(title="t", agent="a", budget={"max_cost_usd": 1})["id"]
    with AgentRun(api, run_id, "w", push=False, heartbeat_interval=3600) as run:
        first = run.report_usage(model="gpt-4o", input_tokens=1000, output_tokens=100)
        assert first["status"] == "accepted"
        assert Usage.objects.get(run_id=run_id).price_source == "table"
        run.report_usage(model="gpt-4o", input_tokens=1, output_tokens=1, cost_usd=Decimal(1))
        stopped = Run.objects.get(pk=run_id)
        assert (stopped.status, stopped.stop_reason) == ("cancel_requested", "budget_exhausted")
    assert Run.objects.get(pk=run_id).cost_usd > 1


def test_a_team_over_its_budget_refuses_the_clients_permit_as_a_refusal(client, team, agent_token):
    from runs import services
    from runs.actors import Actor
    from safestop_agent import Refused

    services.team_budget_set(
        team_id=team.pk,
        actor=Actor.system("test"),
        time_zone="UTC",
        daily_usd="0.5",
        monthly_usd=None,
    )
    api = bridge(client, agent_token)
    spender = api.create_run(title="spender", agent="a")["id"]
    other = api.create_run(title="other", agent="a")["id"]
    with AgentRun(api, spender, "w1", push=False, heartbeat_interval=3600) as run:
        run.report_usage(model="gpt-4o", input_tokens=1, output_tokens=1, cost_usd=Decimal("0.5"))
    assert Run.objects.get(pk=spender).stop_reason == "budget_exhausted"
    with AgentRun(api, other, "w2", push=False, heartbeat_interval=3600) as run:
        with pytest.raises(Refused) as refused:
            api.request_permit(
                other,
                epoch=run.epoch,
                tool_call_id="c1",
                tool="search",
                side_effect="none",
                arguments={},
            )
    assert refused.value.code == "budget_exhausted"
    assert "team_daily_usd" in refused.value.detail
    assert Run.objects.get(pk=other).stop_reason == "budget_exhausted"
