"""The API takes what its schema says and nothing else (clients are generated from it): a number is not a
string, a string is not a number or a boolean, a blank query value means "not given", a bad
`limit` is refused. The live schemathesis run (test_schema_live.py) checks every operation;
these are the classes it found, each pinned fast."""

from __future__ import annotations

import pytest

from tests.support.api import url
from tests.support.scenarios import make_run, make_running

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"title": 12, "agent": "bot"}, "title"),
        ({"title": "Report", "agent": "bot", "idempotency_key": 7}, "idempotency_key"),
        (
            {"title": "Report", "agent": "bot", "budget": {"max_seconds": "60"}},
            "budget.max_seconds",
        ),
        ({"title": "Report", "agent": "bot", "budget": {"max_seconds": 1.5}}, "budget.max_seconds"),
        ({"title": "   ", "agent": "bot"}, "title"),
    ],
)
def test_run_create_refuses_other_json_types(api, agent_token, body, field):
    response = api.post("/api/v1/runs/", body, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"epoch": "1"}, "epoch"),
        ({"tool_call_id": 5}, "tool_call_id"),
        ({"needs_approval": 1}, "needs_approval"),
        ({"needs_approval": "yes"}, "needs_approval"),
        ({"arguments": None}, "arguments"),
    ],
)
def test_permits_refuse_other_json_types(api, team, agent_token, change, field):
    run, lease = make_running(team)
    body = {"epoch": lease.epoch, "tool_call_id": "call-1", "tool": "search", **change}
    response = api.post(url(run, "permits/"), body, agent_token)
    assert response.status_code == 400
    assert response.json()["field"] == field


def test_any_json_but_null_is_a_permits_arguments(api, team, agent_token):
    run, lease = make_running(team)
    body = {"epoch": lease.epoch, "tool_call_id": "call-1", "tool": "search", "arguments": [1]}
    response = api.post(url(run, "permits/"), body, agent_token)
    assert response.status_code == 201
    assert response.json()["arguments"] == [1]


def test_a_blank_query_value_is_not_given(api, team, reviewer_token):
    make_run(team)
    response = api.get("/api/v1/runs/", reviewer_token, status="", limit="", cursor="")
    assert response.status_code == 200
    assert len(response.json()["results"]) == 1


@pytest.mark.parametrize("limit", ["0", "-1", "abc", "1.5", "\u0663"])
def test_a_bad_limit_is_refused(api, team, reviewer_token, limit):
    response = api.get("/api/v1/runs/", reviewer_token, limit=limit)
    assert response.status_code == 400
    assert response.json()["field"] == "limit"


def test_a_large_limit_reads_the_largest_page(api, team, reviewer_token):
    make_run(team)
    assert api.get("/api/v1/runs/", reviewer_token, limit="100000").status_code == 200


def test_the_schema_states_the_rules_it_can(client):
    document = client.get("/api/schema/?format=json").json()
    runs_list = document["paths"]["/api/v1/runs/"]["get"]
    parameters = {parameter["name"]: parameter for parameter in runs_list["parameters"]}
    assert parameters["status"]["allowEmptyValue"] is True
    assert parameters["limit"]["schema"]["minimum"] == 1
    for status in ("400", "401", "426", "429", "503"):
        assert status in runs_list["responses"]
    create = document["components"]["schemas"]["RunCreateInRequest"]["properties"]
    assert create["title"]["type"] == "string" and "pattern" in create["title"]
