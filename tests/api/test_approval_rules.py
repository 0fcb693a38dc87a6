"""/api/v1/approval-rules/: team admins write a team's approval rules through the same service as
the console (validated, ledgered); reviewers read them; viewers and agent tokens are refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from runs import services
from runs.actors import Actor
from runs.models import ApprovalRule, LedgerEntry, Membership, Role
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db

RULES = "/api/v1/approval-rules/"


def rule_url(rule: ApprovalRule | int) -> str:
    return f"{RULES}{rule if isinstance(rule, int) else rule.pk}/"


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


PAYMENTS = {
    "name": "payments",
    "tool_glob": "payments.*",
    "side_effect": "write",
    "risk": "high",
    "timeout_seconds": 600,
    "escalate_after_seconds": 120,
}


def test_a_team_admin_creates_a_rule_that_holds_the_next_matching_permit(alice, team):
    created = send(as_user(alice), "post", RULES, PAYMENTS)
    assert created.status_code == 201, created.content
    body = created.json()
    assert {key: body[key] for key in PAYMENTS} == PAYMENTS
    assert (body["team"], body["enabled"], body["created_by"]) == ("acme", True, "alice")
    entry = LedgerEntry.objects.filter(action="approval_rule.created").get()
    assert (entry.actor, entry.team_slug, entry.payload["rule_id"]) == ("alice", "acme", body["id"])

    run, lease = make_running(team)
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="c1",
        tool="payments.refund",
        side_effect="write",
        actor=Actor.system("agent"),
    )
    assert record.execution_state == "awaiting_approval"
    assert record.approval.rule_name == "payments"


def test_patch_changes_only_the_given_fields_and_ledgers_before_and_after(alice, team):
    client = as_user(alice)
    rule = send(client, "post", RULES, PAYMENTS).json()
    changed = send(client, "patch", rule_url(rule["id"]), {"enabled": False, "risk": "low"})
    assert changed.status_code == 200, changed.content
    assert (changed.json()["enabled"], changed.json()["risk"]) == (False, "low")
    assert changed.json()["tool_glob"] == "payments.*"
    entry = LedgerEntry.objects.filter(action="approval_rule.updated").get()
    assert entry.payload["changes"] == {
        "enabled": {"from": True, "to": False},
        "risk": {"from": "high", "to": "low"},
    }
    # Nothing changed: nothing written.
    again = send(client, "patch", rule_url(rule["id"]), {"risk": "low"})
    assert again.status_code == 200
    assert LedgerEntry.objects.filter(action="approval_rule.updated").count() == 1


def test_delete_is_204_ledgered_and_the_rule_is_gone(alice, team):
    client = as_user(alice)
    rule = send(client, "post", RULES, PAYMENTS).json()
    deleted = send(client, "delete", rule_url(rule["id"]))
    assert deleted.status_code == 204
    assert not ApprovalRule.objects.exists()
    entry = LedgerEntry.objects.filter(action="approval_rule.deleted").get()
    assert (entry.actor, entry.payload["name"]) == ("alice", "payments")
    assert send(client, "get", rule_url(rule["id"])).status_code == 404


def test_reviewers_read_rules_in_the_order_they_are_tried(alice, bob, team, reviewer_token):
    admin = as_user(alice)
    send(admin, "post", RULES, {**PAYMENTS, "position": 20})
    send(admin, "post", RULES, {"name": "deletes", "tool_glob": "*.delete", "position": 10})
    for caller, token in ((as_user(bob), None), (Client(), reviewer_token)):
        listed = send(caller, "get", RULES, token=token)
        assert listed.status_code == 200
        assert [rule["name"] for rule in listed.json()["results"]] == ["deletes", "payments"]
        one = listed.json()["results"][0]
        assert send(caller, "get", rule_url(one["id"]), token=token).json() == one


@pytest.mark.parametrize("who", ["bob", "charlie", "reviewer_token", "agent_token"])
def test_only_team_admins_write_rules(who, request, alice, team):
    rule = send(as_user(alice), "post", RULES, PAYMENTS).json()
    caller = request.getfixturevalue(who)
    client, token = (Client(), caller) if who.endswith("_token") else (as_user(caller), None)
    for method, path, body in (
        ("post", RULES, {**PAYMENTS, "name": "other"}),
        ("patch", rule_url(rule["id"]), {"enabled": False}),
        ("delete", rule_url(rule["id"]), None),
    ):
        answer = send(client, method, path, body, token)
        assert answer.status_code == 403, (method, answer.content)
        assert answer.json()["error"] == "forbidden"
    assert ApprovalRule.objects.get().enabled is True
    assert ApprovalRule.objects.count() == 1


@pytest.mark.parametrize("who", ["charlie", "agent_token"])
def test_viewers_and_agent_tokens_cannot_read_rules(who, request, alice, team):
    rule = send(as_user(alice), "post", RULES, PAYMENTS).json()
    caller = request.getfixturevalue(who)
    client, token = (Client(), caller) if who.endswith("_token") else (as_user(caller), None)
    assert send(client, "get", RULES, token=token).status_code == 403
    assert send(client, "get", rule_url(rule["id"]), token=token).status_code == 403


def test_another_teams_rule_is_a_404_and_its_team_cannot_be_named(alice, outsider, other_team):
    theirs = send(as_user(outsider), "post", RULES, PAYMENTS).json()
    mine = as_user(alice)
    assert send(mine, "get", rule_url(theirs["id"])).status_code == 404
    assert send(mine, "patch", rule_url(theirs["id"]), {"enabled": False}).status_code == 404
    assert send(mine, "delete", rule_url(theirs["id"])).status_code == 404
    named = send(mine, "post", RULES, {**PAYMENTS, "team": other_team.slug})
    assert named.status_code == 404
    assert send(mine, "get", RULES).json()["results"] == []
    assert ApprovalRule.objects.get().enabled is True


def test_an_admin_of_several_teams_names_the_team(alice, team, other_team):
    Membership.objects.create(user=alice, team=other_team, role=Role.ADMIN)
    client = as_user(alice)
    unnamed = send(client, "post", RULES, PAYMENTS)
    assert (unnamed.status_code, unnamed.json()["field"]) == (400, "team")
    named = send(client, "post", RULES, {**PAYMENTS, "team": "globex"})
    assert (named.status_code, named.json()["team"]) == (201, "globex")
    only_globex = send(client, "get", RULES + "?team=globex").json()["results"]
    assert [rule["team"] for rule in only_globex] == ["globex"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tool_glob": "x"}, "name"),
        ({**PAYMENTS, "tool_name": "x"}, "tool_name"),
        ({**PAYMENTS, "timeout_seconds": "600"}, "timeout_seconds"),
        ({**PAYMENTS, "timeout_seconds": 0}, "timeout_seconds"),
        ({**PAYMENTS, "risk": "extreme"}, "risk"),
        ({**PAYMENTS, "tool_glob": "payments.[abc"}, "tool_glob"),
        ({**PAYMENTS, "escalate_after_seconds": 600}, "escalate_after_seconds"),
        ({**PAYMENTS, "transport": "webhook"}, "transport"),
        ({"name": "x", "applies_to": "outbox", "tool_glob": "t"}, "tool_glob"),
        ({"name": "x", "side_effect": "none"}, "side_effect"),
    ],
)
def test_a_bad_rule_is_a_400_naming_the_field(alice, team, body, field):
    answer = send(as_user(alice), "post", RULES, body)
    assert answer.status_code == 400, answer.content
    assert (answer.json()["error"], answer.json()["field"]) == ("invalid", field)
    assert answer.json()["detail"]
    assert not ApprovalRule.objects.exists()


def test_a_duplicate_name_and_a_bad_patch_are_400s(alice, team):
    client = as_user(alice)
    rule = send(client, "post", RULES, PAYMENTS).json()
    duplicate = send(client, "post", RULES, PAYMENTS)
    assert (duplicate.status_code, duplicate.json()["field"]) == (400, "name")
    bad = send(client, "patch", rule_url(rule["id"]), {"escalate_after_seconds": 900})
    assert (bad.status_code, bad.json()["field"]) == (400, "escalate_after_seconds")
    assert ApprovalRule.objects.get().escalate_after_seconds == 120


def test_a_rule_id_out_of_range_is_a_404(alice, team):
    assert send(as_user(alice), "get", rule_url(10**30)).status_code == 404


HOSTILE = [None, True, 0, -1, 2**31, 2**63, 1.5, "", " ", "\x00", "x" * 10_000, "[", [], {}, "é"]


def test_hostile_values_in_every_field_are_4xx_never_5xx(alice, team):
    client = Client(raise_request_exception=False)
    client.force_login(alice)
    rule = send(client, "post", RULES, PAYMENTS).json()
    fields = [*PAYMENTS, "enabled", "position", "applies_to", "agent_glob", "transport"]
    fields += ["destination_glob", "team"]
    for name in fields:
        for value in HOSTILE:
            created = send(client, "post", RULES, {**PAYMENTS, "name": "other", name: value})
            changed = send(client, "patch", rule_url(rule["id"]), {name: value})
            for answer in (created, changed):
                assert answer.status_code < 500, (name, value, answer.content[:300])
                assert answer["Content-Type"].startswith("application/json")
    for raw in (b"[]", b"null", b'"x"', b"{"):
        answer = client.patch(rule_url(rule["id"]), data=raw, content_type="application/json")
        assert answer.status_code == 400, raw
