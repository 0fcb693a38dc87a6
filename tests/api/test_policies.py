"""/api/v1/policies/: team admins write and test a team's policies through the same services
as the console; viewers, reviewers and reviewer tokens read them; agent tokens are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from policies.models import Policy
from runs.models import ExecutionState, LedgerEntry
from tests.support.policies import permit, result
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db

POLICIES = "/api/v1/policies/"
LOOP = {"name": "loop", "expression": "call.repeats >= 3", "action": "stop"}


def send(client: Client, method: str, path: str, body: Any = None, token: Any = None) -> Any:
    headers = token.header if token is not None else {}
    call = getattr(client, method)
    if body is None:
        return call(path, **headers)
    return call(path, data=json.dumps(body), content_type="application/json", **headers)


def as_user(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_creates_reads_changes_and_deletes_a_policy(alice, team):
    admin = as_user(alice)
    created = send(admin, "post", POLICIES, {**LOOP, "mode": "enforce"})
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["name"], body["mode"], body["on_error"], body["team"]) == (
        "loop",
        "enforce",
        "require_approval",
        "acme",
    )
    url = f"{POLICIES}{body['id']}/"
    assert send(admin, "get", url).json()["expression"] == "call.repeats >= 3"
    changed = send(admin, "patch", url, {"expression": "call.repeats >= 4"})
    assert changed.status_code == 200 and changed.json()["expression"] == "call.repeats >= 4"
    assert send(admin, "delete", url).status_code == 204
    assert not Policy.objects.exists()
    actions = list(
        LedgerEntry.objects.filter(action__startswith="policy.").values_list("action", flat=True)
    )
    assert actions == ["policy.created", "policy.updated", "policy.deleted"]


def test_a_new_policy_observes_unless_told_to_enforce(alice, team):
    assert send(as_user(alice), "post", POLICIES, LOOP).json()["mode"] == "observe"


@pytest.mark.parametrize(
    ("expression", "line", "column", "says"),
    [
        ("run.stepz > 1", 1, 4, "undeclared reference to 'run.stepz'"),
        ("run.steps + 1", 1, 1, "must be a boolean"),
        ("run.steps > 1 &&\n  run.cost_usd > 5", 2, 16, "no matching overload"),
    ],
)
def test_a_bad_expression_is_refused_at_the_field_with_line_and_column(
    alice, team, expression, line, column, says
):
    answer = send(as_user(alice), "post", POLICIES, {**LOOP, "expression": expression})
    assert answer.status_code == 400
    body = answer.json()
    assert body["field"] == "expression"
    assert (body["line"], body["column"]) == (line, column)
    assert says in body["detail"]
    assert not Policy.objects.exists()


def test_unknown_fields_and_bad_choices_are_refused(alice, team):
    admin = as_user(alice)
    assert send(admin, "post", POLICIES, {**LOOP, "when": "x"}).status_code == 400
    assert send(admin, "post", POLICIES, {**LOOP, "action": "explode"}).status_code == 400
    send(admin, "post", POLICIES, LOOP)
    duplicate = send(admin, "post", POLICIES, LOOP)
    assert duplicate.status_code == 400 and duplicate.json()["field"] == "name"


def test_who_reads_and_who_writes(alice, bob, charlie, team, agent_token, reviewer_token, outsider):
    send(as_user(alice), "post", POLICIES, LOOP)
    policy = Policy.objects.get()
    for reader in (as_user(bob), as_user(charlie)):
        listed = send(reader, "get", POLICIES).json()
        assert [p["name"] for p in listed["results"]] == ["loop"]
        assert len(listed["templates"]) == 6
        assert "run.tool_failures_in_a_row" in listed["context"]
        assert send(reader, "post", POLICIES, {**LOOP, "name": "x"}).status_code == 403
        assert send(reader, "delete", f"{POLICIES}{policy.pk}/").status_code == 403
    assert send(Client(), "get", POLICIES, token=reviewer_token).status_code == 200
    assert send(Client(), "get", POLICIES, token=agent_token).status_code == 403
    assert send(as_user(outsider), "get", f"{POLICIES}{policy.pk}/").status_code == 404
    assert send(as_user(outsider), "get", POLICIES).json()["results"] == []


def test_test_against_history_counts_the_runs_it_would_have_acted_on(alice, team):
    looping, _ = make_running(team)
    for n in range(4):
        permit(looping, f"c{n}")
    failing, _ = make_running(team)
    for n in range(3):
        permit(failing, f"f{n}", arguments={"q": n})
        result(failing, f"f{n}", ExecutionState.FAILED)
    quiet, _ = make_running(team)
    permit(quiet, "q1")
    answer = send(
        as_user(alice), "post", f"{POLICIES}test/", {"expression": "call.repeats >= 3", "days": 1}
    )
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert (body["runs"], body["runs_acted_on"]) == (3, 1)
    assert body["events"] == 4 + 6 + 1
    [example] = body["examples"]
    assert example["run_id"] == looping.pk
    assert example["values"] == {"call.repeats": 3}
    streak = send(
        as_user(alice),
        "post",
        f"{POLICIES}test/",
        {"expression": "run.tool_failures_in_a_row >= 2"},
    ).json()
    assert [e["run_id"] for e in streak["examples"]] == [failing.pk]


def test_test_a_saved_policy_and_refusals(alice, bob, team):
    admin = as_user(alice)
    policy = send(admin, "post", POLICIES, LOOP).json()
    assert send(admin, "post", f"{POLICIES}test/", {"policy": policy["id"]}).status_code == 200
    bad = send(admin, "post", f"{POLICIES}test/", {"expression": "nope"})
    assert bad.status_code == 400 and bad.json()["field"] == "expression"
    assert send(admin, "post", f"{POLICIES}test/", {"days": 1}).status_code == 400
    reviewer = send(as_user(bob), "post", f"{POLICIES}test/", {"expression": "true"})
    assert reviewer.status_code == 403
