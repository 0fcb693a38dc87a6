"""Approvals over the API (DESIGN §10): held permits and outbox items, the inbox, decisions.

The races at the end use real threads on PostgreSQL, each request on its own connection.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from api.models import Denial
from runs import services
from runs.actors import Actor
from runs.models import (
    Approval,
    ApprovalRule,
    ExecutionRecord,
    LedgerEntry,
    OutboxItem,
    Run,
    StopRequest,
)
from runs.tokens import api_token_create
from tests.support.api import Api, stop, url
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
DECISIONS = ("approval.approved", "approval.rejected", "approval.expired", "approval.voided")
SCHEMA = {
    "type": "object",
    "properties": {
        "amount": {"type": "integer", "minimum": 1, "maximum": 1000},
        "to": {"type": "string"},
    },
    "required": ["amount", "to"],
    "additionalProperties": False,
}


@pytest.fixture(autouse=True)
def _no_rate_limit(settings):
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 0
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]


@pytest.fixture
def payments_rule(team) -> ApprovalRule:
    return ApprovalRule.objects.create(
        team=team, name="payments", tool_glob="pay_*", side_effect="write", risk="high"
    )


@pytest.fixture
def outsider_reviewer_token(other_team):
    from tests.support.accounts import IssuedToken

    token, raw = api_token_create(team_slug=other_team.slug, name="globex-rev", role="reviewer")
    return IssuedToken(token, raw)


def permit(tool_call_id: str = "call_1", epoch: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "tool_call_id": tool_call_id,
        "tool": "pay_invoice",
        "side_effect": "write",
        "arguments": {"amount": 120, "to": "ACME-7"},
        **extra,
    }


def decide_url(approval_id: str) -> str:
    return f"/api/v1/approvals/{approval_id}/decide/"


def held(api: Api, run: Run, token: Any, tool_call_id: str = "call_1", **extra: Any) -> dict:
    """A permit that waits: answers its approval."""
    response = api.post(url(run, "permits/"), permit(tool_call_id, **extra), token)
    assert response.status_code == 202, response.json()
    return response.json()["approval"]


def entries(run: Run, *actions: str) -> int:
    return LedgerEntry.objects.filter(run=run, action__in=actions).count()


# ---------------------------------------------------------------------------------------------
# a held permit


def test_a_rule_holds_the_permit_202_with_the_approval_and_no_permit_id(
    api, team, agent_token, payments_rule
):
    run, _ = make_running(team)
    response = api.post(url(run, "permits/"), permit(summary="pay ACME"), agent_token)
    assert response.status_code == 202
    body = response.json()
    assert set(body) == {"tool_call_id", "epoch", "approval"}
    assert (body["tool_call_id"], body["epoch"]) == ("call_1", 1)
    approval = body["approval"]
    assert approval["id"].startswith("appr_")
    assert {key: approval[key] for key in ("status", "rule", "target", "tool", "risk")} == {
        "status": "waiting",
        "rule": "payments",
        "target": "tool_call",
        "tool": "pay_invoice",
        "risk": "high",
    }
    assert approval["tool_call_id"] == "call_1" and approval["outbox_id"] is None
    assert approval["run_id"] == run.pk and approval["epoch"] == 1 and approval["team"] == "acme"
    assert (
        approval["original_arguments"] == approval["arguments"] == {"amount": 120, "to": "ACME-7"}
    )
    assert approval["permit_id"] is None and approval["decided_by"] is None
    assert approval["deadline"] > approval["requested_at"]
    assert approval["summary"] == "pay ACME" and "payments" in approval["match_reason"]
    record = ExecutionRecord.objects.get(run=run)
    assert record.execution_state == "awaiting_approval"
    assert entries(run, "approval.requested") == 1

    again = api.post(url(run, "permits/"), permit(), agent_token)
    assert again.status_code == 202
    assert again.json()["approval"]["id"] == approval["id"]
    assert "permit_id" not in again.json()
    assert Approval.objects.filter(run=run).count() == 1


def test_an_agent_may_ask_for_approval_itself(api, team, agent_token):
    run, _ = make_running(team)
    response = api.post(
        url(run, "permits/"),
        permit(
            tool="send_email",
            needs_approval=True,
            summary="mail the customer",
            risk="low",
            arguments_schema=SCHEMA,
        ),
        agent_token,
    )
    assert response.status_code == 202
    approval = response.json()["approval"]
    assert approval["rule"] is None and approval["match_reason"] == "asked by the agent"
    assert (approval["risk"], approval["summary"]) == ("low", "mail the customer")
    assert approval["arguments_schema"] == SCHEMA


def test_no_rule_and_no_flag_permits_at_once_as_before(api, team, agent_token, payments_rule):
    run, _ = make_running(team)
    response = api.post(
        url(run, "permits/"), permit(tool="search", side_effect="none"), agent_token
    )
    assert response.status_code == 201
    body = response.json()
    assert body["permit_id"] == f"permit_{ExecutionRecord.objects.get(run=run).pk}"
    assert body["arguments"] == {"amount": 120, "to": "ACME-7"}
    assert "approval" not in body
    assert not Approval.objects.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"risk": "extreme"}, "risk"),
        ({"summary": "s" * 2001}, "summary"),
        ({"needs_approval": "perhaps"}, "needs_approval"),
        ({"arguments_schema": [1, 2]}, "arguments_schema"),
        ({"arguments_schema": {"type": "no-such-type"}}, "arguments_schema"),
    ],
)
def test_permit_approval_fields_are_checked(api, team, agent_token, change, field):
    run, _ = make_running(team)
    response = api.post(
        url(run, "permits/"), permit(**{"needs_approval": True, **change}), agent_token
    )
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert not ExecutionRecord.objects.filter(run=run).exists()


# ---------------------------------------------------------------------------------------------
# deciding


def test_approve_with_edits_gives_the_permit_and_the_retry_runs_the_edited_arguments(
    api, team, agent_token, reviewer_token
):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True, arguments_schema=SCHEMA)
    edited = {"amount": 99, "to": "ACME-7"}
    response = api.post(
        decide_url(approval["id"]),
        {"decision": "approve", "message": "capped at 99", "arguments": edited},
        reviewer_token,
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    record = ExecutionRecord.objects.get(run=run)
    assert body["status"] == "approved" and body["edited"] is True
    assert body["permit_id"] == f"permit_{record.pk}"
    assert body["arguments"] == edited
    assert body["original_arguments"] == {"amount": 120, "to": "ACME-7"}
    assert (body["decided_by"], body["message"]) == ("reviewer-bot", "capped at 99")
    assert body["decided_at"] is not None
    assert record.execution_state == "permitted" and record.arguments == edited
    entry = LedgerEntry.objects.get(run=run, action="approval.approved")
    assert entry.payload["original_arguments"] == {"amount": 120, "to": "ACME-7"}
    assert entry.payload["arguments"] == edited

    retry = api.post(url(run, "permits/"), permit(), agent_token)
    assert retry.status_code == 201
    assert retry.json()["permit_id"] == body["permit_id"]
    assert retry.json()["arguments"] == edited
    assert retry.json()["approval"]["status"] == "approved"

    # the agent's fallback for the push: its own team's approval, by GET
    polled = api.get(f"/api/v1/approvals/{approval['id']}/", agent_token)
    assert polled.status_code == 200
    assert (polled.json()["permit_id"], polled.json()["arguments"]) == (body["permit_id"], edited)


def test_approve_as_is_keeps_the_original_arguments(api, team, agent_token, bob, client):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    client.force_login(bob)
    response = api.post(decide_url(approval["id"]), {"decision": "approve"})
    assert response.status_code == 200
    assert response.json()["edited"] is False
    assert response.json()["arguments"] == {"amount": 120, "to": "ACME-7"}
    assert response.json()["decided_by"] == "bob"


def test_reject_answers_200_and_a_permit_retry_is_409_approval_closed(
    api, team, agent_token, reviewer_token
):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    response = api.post(
        decide_url(approval["id"]),
        {"decision": "reject", "message": "wrong account"},
        reviewer_token,
    )
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["message"]) == ("rejected", "wrong account")
    assert response.json()["permit_id"] is None
    assert ExecutionRecord.objects.get(run=run).execution_state == "not_started"
    assert entries(run, "approval.rejected") == 1

    retry = api.post(url(run, "permits/"), permit(), agent_token)
    assert retry.status_code == 409
    assert retry.json()["error"] == "approval_closed"
    assert retry.json()["approval"]["status"] == "rejected"
    assert retry.json()["approval"]["message"] == "wrong account"
    assert "permit_id" not in retry.json()


def test_a_second_decision_is_409_already_decided_with_the_first(
    api, team, agent_token, reviewer_token
):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    first = api.post(decide_url(approval["id"]), {"decision": "approve"}, reviewer_token)
    assert first.status_code == 200
    for body in ({"decision": "reject", "message": "no"}, {"decision": "approve"}):
        again = api.post(decide_url(approval["id"]), body, reviewer_token)
        assert again.status_code == 409
        refusal = again.json()
        assert refusal["error"] == "already_decided"
        assert (refusal["approval_status"], refusal["decided_by"]) == ("approved", "reviewer-bot")
        assert refusal["approval"]["permit_id"] == first.json()["permit_id"]
    assert entries(run, *DECISIONS) == 1


def test_an_expired_approval_cannot_be_approved(api, team, agent_token, reviewer_token):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    pk = services.parse_approval_id(approval["id"])
    deadline = Approval.objects.get(pk=pk).deadline
    assert services.approval_expire(approval_id=pk, now=deadline + timedelta(seconds=1))
    response = api.post(decide_url(approval["id"]), {"decision": "approve"}, reviewer_token)
    assert response.status_code == 409
    assert (response.json()["error"], response.json()["approval_status"]) == (
        "already_decided",
        "expired",
    )
    assert ExecutionRecord.objects.get(run=run).execution_state == "not_started"


def test_a_stop_voids_the_waiting_approval_and_deciding_it_is_409_approval_void(
    api, team, agent_token, reviewer_token
):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    stop(run)
    response = api.post(decide_url(approval["id"]), {"decision": "approve"}, reviewer_token)
    assert response.status_code == 409
    assert response.json()["error"] == "approval_void"
    assert response.json()["approval"]["status"] == "void"
    assert ExecutionRecord.objects.get(run=run).execution_state == "not_started"
    assert entries(run, "approval.approved") == 0


def test_an_approval_of_epoch_n_never_permits_work_at_n_plus_1(
    api, team, agent_token, reviewer_token
):
    run, lease = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    stop(run)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    assert reload(run).status == "stopped_cleanly"
    services.run_resume(run_id=run.pk, actor=Actor.system("test"))
    lease2 = services.lease_acquire(run_id=run.pk, worker_id="w2", ttl_seconds=30, actor=AGENT)
    assert reload(run).status == "running" and lease2.epoch > 1

    response = api.post(decide_url(approval["id"]), {"decision": "approve"}, reviewer_token)
    assert response.status_code == 409
    assert response.json()["error"] == "approval_void"
    # the old call cannot come back at the new epoch either
    again = api.post(url(run, "permits/"), permit(epoch=lease2.epoch), agent_token)
    assert again.status_code == 409
    assert "permit_id" not in again.json()
    record = ExecutionRecord.objects.get(run=run, tool_call_id="call_1")
    assert (record.execution_state, record.permit_epoch) == ("not_started", 1)
    assert not ExecutionRecord.objects.filter(run=run, execution_state="permitted").exists()


# ---------------------------------------------------------------------------------------------
# outbox items


def test_an_outbox_item_waits_and_is_released_by_the_approval(
    api, team, agent_token, reviewer_token
):
    ApprovalRule.objects.create(
        team=team, name="customer hooks", applies_to="outbox", destination_glob="*hooks.example*"
    )
    run, _ = make_running(team)
    body = {
        "epoch": 1,
        "transport": "webhook",
        "destination": "https://hooks.example/in",
        "payload": {"text": "refund issued"},
        "idempotency_key": "notify-1",
    }
    response = api.post(url(run, "outbox/"), body, agent_token)
    assert response.status_code == 201
    item = response.json()
    assert item["status"] == "awaiting_approval" and item["idempotency_key"] == "notify-1"
    approval = item["approval"]
    assert (approval["target"], approval["outbox_id"], approval["tool_call_id"]) == (
        "outbox",
        item["id"],
        None,
    )
    again = api.post(url(run, "outbox/"), body, agent_token)
    assert again.status_code == 200
    assert again.json()["approval"]["id"] == approval["id"]

    decided = api.post(
        decide_url(approval["id"]),
        {"decision": "approve", "arguments": {"text": "refund issued (ref 7)"}},
        reviewer_token,
    )
    assert decided.status_code == 200
    assert decided.json()["permit_id"] is None  # an item has no permit; it is released
    stored = OutboxItem.objects.get(run=run)
    assert (stored.status, stored.payload) == ("pending", {"text": "refund issued (ref 7)"})


def test_an_outbox_item_without_a_rule_is_pending_with_no_approval(api, team, agent_token):
    run, _ = make_running(team)
    response = api.post(
        url(run, "outbox/"),
        {
            "epoch": 1,
            "transport": "webhook",
            "destination": "https://hooks.example/in",
            "payload": {},
            "idempotency_key": "k",
        },
        agent_token,
    )
    assert response.status_code == 201
    assert response.json()["status"] == "pending" and "approval" not in response.json()


# ---------------------------------------------------------------------------------------------
# the list and one approval


def test_the_list_is_the_teams_waiting_approvals_soonest_deadline_first(
    api, team, other_team, agent_token, reviewer_token, outsider_token, client, bob
):
    run, _ = make_running(team)
    first = held(api, run, agent_token, "call_1", needs_approval=True, risk="high")
    second = held(api, run, agent_token, "call_2", needs_approval=True, tool="deploy", risk="low")
    decided = held(api, run, agent_token, "call_3", needs_approval=True)
    api.post(decide_url(decided["id"]), {"decision": "reject"}, reviewer_token)
    theirs, _ = make_running(other_team)
    held(api, theirs, outsider_token, needs_approval=True)

    listed = api.get("/api/v1/approvals/", reviewer_token)
    assert listed.status_code == 200
    assert [a["id"] for a in listed.json()["results"]] == [first["id"], second["id"]]

    def ids(**query: Any) -> list[str]:
        response = api.get("/api/v1/approvals/", reviewer_token, **query)
        assert response.status_code == 200, response.json()
        return [a["id"] for a in response.json()["results"]]

    assert ids(status="all") == [decided["id"], second["id"], first["id"]]
    assert ids(status="rejected") == [decided["id"]]
    assert ids(risk="low") == [second["id"]]
    assert ids(tool="deploy") == [second["id"]]
    assert ids(agent="report-bot", run=run.pk) == [first["id"], second["id"]]
    assert ids(agent="someone-else") == []
    page = api.get("/api/v1/approvals/", reviewer_token, limit=1).json()
    assert [a["id"] for a in page["results"]] == [first["id"]] and page["next"]

    client.force_login(bob)
    assert [a["id"] for a in api.get("/api/v1/approvals/").json()["results"]] == [
        first["id"],
        second["id"],
    ]


@pytest.mark.parametrize("query", [{"status": "pending"}, {"risk": "huge"}, {"run": "r" * 33}])
def test_the_list_refuses_bad_filters(api, reviewer_token, query):
    response = api.get("/api/v1/approvals/", reviewer_token, **query)
    assert response.status_code == 400
    assert response.json()["field"] == next(iter(query))


def test_agent_tokens_and_strangers_may_not_list(api, agent_token):
    assert api.get("/api/v1/approvals/", agent_token).status_code == 403
    assert api.get("/api/v1/approvals/").status_code == 401


# ---------------------------------------------------------------------------------------------
# who may decide, and another team's approvals


def test_another_teams_approval_is_404_for_tokens_and_users(
    api, client, team, agent_token, outsider_token, outsider_reviewer_token, outsider
):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    detail = f"/api/v1/approvals/{approval['id']}/"
    for token in (outsider_token, outsider_reviewer_token):
        assert api.get(detail, token).status_code == 404
        refused = api.post(decide_url(approval["id"]), {"decision": "approve"}, token)
        assert refused.status_code == 404
        assert refused.json() == {
            "error": "not_found",
            "detail": f"approval {approval['id']!r} does not exist",
        }
    client.force_login(outsider)
    assert api.get(detail).status_code == 404
    assert api.post(decide_url(approval["id"]), {"decision": "approve"}).status_code == 404
    assert Approval.objects.get().status == "waiting"
    assert Denial.objects.filter(reason="wrong_team").exists()


def test_an_agent_token_and_a_viewer_may_not_decide(api, client, team, agent_token, charlie):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True)
    refused = api.post(decide_url(approval["id"]), {"decision": "approve"}, agent_token)
    assert refused.status_code == 403
    assert refused.json()["error"] == "forbidden" and "reviewer" in refused.json()["detail"]
    client.force_login(charlie)
    assert api.get(f"/api/v1/approvals/{approval['id']}/").status_code == 200  # viewers read
    assert api.post(decide_url(approval["id"]), {"decision": "approve"}).status_code == 403
    assert Approval.objects.get().status == "waiting"
    assert entries(run, *DECISIONS) == 0
    assert Denial.objects.filter(reason="wrong_role").exists()


# ---------------------------------------------------------------------------------------------
# bad input: a clear 4xx and nothing written


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"decision": "maybe"}, "decision", 'decision must be "approve" or "reject"'),
        ({}, "decision", "required"),
        ({"decision": "approve", "arguments": [1, 2]}, "arguments", "not an array"),
        ({"decision": "approve", "arguments": "amount=5"}, "arguments", "not a string"),
        ({"decision": "approve", "arguments": 5}, "arguments", "not a number"),
        ({"decision": "approve", "arguments": {"amount": 5000, "to": "x"}}, "arguments", "amount"),
        ({"decision": "approve", "arguments": {"to": "x"}}, "arguments", "'amount' is a required"),
        ({"decision": "approve", "arguments": {"amount": 5, "to": "x", "z": 1}}, "arguments", "z"),
        ({"decision": "reject", "arguments": {"amount": 5, "to": "x"}}, "arguments", "rejection"),
        ({"decision": "approve", "message": "m" * 4001}, "message", "4000"),
    ],
)
def test_bad_decisions_are_400_and_write_nothing(
    api, team, agent_token, reviewer_token, body, field, says
):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True, arguments_schema=SCHEMA)
    before = LedgerEntry.objects.filter(run=run).count()
    response = api.post(decide_url(approval["id"]), body, reviewer_token)
    assert response.status_code == 400, response.json()
    assert response.json()["error"] == "invalid"
    assert response.json()["field"] == field
    assert says in response.json()["detail"]
    assert Approval.objects.get().status == "waiting"
    assert ExecutionRecord.objects.get(run=run).execution_state == "awaiting_approval"
    assert LedgerEntry.objects.filter(run=run).count() == before


def test_a_schema_error_names_the_path(api, team, agent_token, reviewer_token):
    run, _ = make_running(team)
    approval = held(api, run, agent_token, needs_approval=True, arguments_schema=SCHEMA)
    response = api.post(
        decide_url(approval["id"]),
        {"decision": "approve", "arguments": {"amount": "ten", "to": "x"}},
        reviewer_token,
    )
    assert response.status_code == 400
    assert "at amount" in response.json()["detail"]


@pytest.mark.parametrize(
    "approval_id",
    ["appr_x", "appr_", "appr_-1", "appr_" + "9" * 30, "appr_99999999", "appr_%00", "%00", "١٢"],
)
def test_malformed_or_missing_ids_are_404(api, team, agent_token, reviewer_token, approval_id):
    run, _ = make_running(team)
    held(api, run, agent_token, needs_approval=True)
    for response in (
        api.get(f"/api/v1/approvals/{approval_id}/", reviewer_token),
        api.post(decide_url(approval_id), {"decision": "approve"}, reviewer_token),
    ):
        assert response.status_code == 404
        assert response.json()["error"] == "not_found"
    assert Approval.objects.get().status == "waiting"
    assert entries(run, *DECISIONS) == 0


def test_the_schema_documents_the_approval_endpoints(client):
    document = client.get("/api/schema/?format=json").json()
    paths = document["paths"]
    assert "get" in paths["/api/v1/approvals/"]
    assert "get" in paths["/api/v1/approvals/{approval_id}/"]
    decide = paths["/api/v1/approvals/{approval_id}/decide/"]["post"]
    assert "requestBody" in decide and "200" in decide["responses"]
    assert "409" in decide["responses"]
    permits = paths["/api/v1/runs/{run_id}/permits/"]["post"]["responses"]
    assert "202" in permits


# ---------------------------------------------------------------------------------------------
# races: real threads, each on its own connection


def _race(pool: ThreadPoolExecutor, *calls: Callable[[], Any]) -> list[Any]:
    """Start every call at the same instant on its own thread; results or exceptions."""
    barrier = threading.Barrier(len(calls))

    def start(call: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - collected and asserted by the caller
            return error

    futures = [pool.submit(start, call) for call in calls]
    return [future.result(timeout=60) for future in futures]


def _close_connection() -> None:
    connection.close()  # this thread's own connection


@pytest.fixture
def pool():
    executor = ThreadPoolExecutor(max_workers=20)
    yield executor
    # One close per thread (the barrier puts one on each): every thread owns a connection.
    _race(executor, *([_close_connection] * 20))
    executor.shutdown(wait=True)


def _decide(token: Any, approval_id: str, body: dict[str, Any]) -> Any:
    # a Client per thread: the test client is not thread-safe
    return Client().post(
        decide_url(approval_id), data=body, content_type="application/json", **token.header
    )


def _after(delay: float, call: Callable[[], Any]) -> Any:
    time.sleep(delay)
    return call()


def _waiting(team: Any, n: int) -> tuple[Run, Any, Approval]:
    run, lease = make_running(team)
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=1,
        tool_call_id=f"call_{n}",
        tool="pay_invoice",
        side_effect="write",
        arguments={"amount": 10, "to": "x"},
        needs_approval=True,
        actor=AGENT,
    )
    assert record.execution_state == "awaiting_approval"
    return run, lease, Approval.objects.get(execution_record=record)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_decisions_make_exactly_one(team, reviewer_token, pool):
    second_token, raw = api_token_create(team_slug=team.slug, name="reviewer-2", role="reviewer")
    from tests.support.accounts import IssuedToken

    tokens = [reviewer_token, IssuedToken(second_token, raw)]
    for n in range(3):
        run, _lease, approval = _waiting(team, n)
        bodies = [
            {"decision": "approve"} if i % 2 else {"decision": "reject", "message": f"no {i}"}
            for i in range(20)
        ]
        answers = _race(
            pool,
            *[
                (
                    lambda i=i, appr=approval.public_id, body=bodies[i]: _decide(
                        tokens[i % 2], appr, body
                    )
                )
                for i in range(20)
            ],
        )
        assert not [a for a in answers if isinstance(a, Exception)], answers
        codes = Counter(a.status_code for a in answers)
        assert codes == {200: 1, 409: 19}, codes
        winner = next(a.json() for a in answers if a.status_code == 200)
        approval.refresh_from_db()
        assert approval.status == winner["status"] in ("approved", "rejected")
        for answer in answers:
            if answer.status_code == 409:
                refusal = answer.json()
                assert refusal["error"] == "already_decided"
                assert refusal["approval_status"] == winner["status"]
                assert refusal["decided_by"] == winner["decided_by"]
                assert refusal["approval"]["decided_at"] == winner["decided_at"]
        assert entries(run, *DECISIONS) == 1
        record = ExecutionRecord.objects.get(run=run)
        expected = "permitted" if winner["status"] == "approved" else "not_started"
        assert record.execution_state == expected


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_approve_racing_a_stop_never_permits_after_the_stop(team, reviewer_token, pool):
    """At least 12 races, until both orders were seen. The stop is held back by a delay that
    follows the outcomes (a decision winning pushes it earlier, a stop winning later), with
    jitter, so the two land on the run lock together."""
    rng = random.Random()
    seen: Counter[str] = Counter()
    violations: list[Any] = []
    stop_delay = 0.004
    for n in range(200):
        if n >= 12 and len(seen) == 2:
            break
        run, _lease, approval = _waiting(team, n)
        jitter = rng.uniform(0, stop_delay * 2)
        answer, outcome = _race(
            pool,
            lambda approval=approval: _decide(
                reviewer_token, approval.public_id, {"decision": "approve"}
            ),
            lambda run=run, jitter=jitter: _after(
                jitter,
                lambda: services.run_stop(run_id=run.pk, reason="user_stop", actor=AGENT),
            ),
        )
        assert not isinstance(answer, Exception) and not isinstance(outcome, Exception)
        stop_request = StopRequest.objects.get(run=run)
        approval.refresh_from_db()
        record = ExecutionRecord.objects.get(pk=approval.execution_record_id)
        if answer.status_code == 200:
            seen["decision first"] += 1
            stop_delay = max(0.0005, stop_delay * 0.7)
            ok = (
                approval.status == "approved"
                and approval.decided_at < stop_request.requested_at
                and record.execution_state == "permitted"
                and record.permit_epoch == stop_request.epoch_before == 1
                and record.cancel_requested
                and answer.json()["permit_id"] == f"permit_{record.pk}"
            )
        else:
            seen["stop first"] += 1
            stop_delay = min(0.2, stop_delay * 1.5)
            ok = (
                answer.status_code == 409
                and answer.json()["error"] == "approval_void"
                and approval.status == "void"
                and record.execution_state == "not_started"
                and entries(run, "approval.approved") == 0
            )
        if not ok:
            violations.append((n, answer.status_code, answer.json(), approval.status))
        if (
            record.execution_state == "permitted"
            and approval.decided_at is not None
            and approval.decided_at >= stop_request.requested_at
        ):
            violations.append((n, "permitted by a decision after the stop"))
    print(f"\napprove vs stop: {dict(seen)}, {len(violations)} violations")
    assert violations == []
    assert set(seen) == {"decision first", "stop first"}, f"only one order observed: {seen}"
    assert sum(seen.values()) >= 12


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_approve_racing_expiry_has_exactly_one_outcome(team, reviewer_token, pool):
    rng = random.Random()
    seen: Counter[str] = Counter()
    for n in range(12):
        run, _lease, approval = _waiting(team, n)
        past = approval.deadline + timedelta(seconds=1)
        # the expiry is a bare service call, the decision an HTTP request: hold the expiry back
        # a little, at random, so that either may take the run lock first
        jitter = rng.uniform(0, 0.01)
        answer, expired = _race(
            pool,
            lambda approval=approval: _decide(
                reviewer_token, approval.public_id, {"decision": "approve"}
            ),
            lambda approval=approval, past=past, jitter=jitter: _after(
                jitter, lambda: services.approval_expire(approval_id=approval.pk, now=past)
            ),
        )
        assert not isinstance(answer, Exception) and not isinstance(expired, Exception)
        approval.refresh_from_db()
        record = ExecutionRecord.objects.get(pk=approval.execution_record_id)
        if answer.status_code == 200:
            seen["approved"] += 1
            assert expired is False
            assert (approval.status, record.execution_state) == ("approved", "permitted")
        else:
            seen["expired"] += 1
            assert expired is True
            assert (answer.status_code, answer.json()["error"]) == (409, "already_decided")
            assert answer.json()["approval_status"] == "expired"
            assert (approval.status, record.execution_state) == ("expired", "not_started")
        assert entries(run, *DECISIONS) == 1
    print(f"\napprove vs expiry: {dict(seen)}")
