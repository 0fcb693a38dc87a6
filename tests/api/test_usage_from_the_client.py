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
