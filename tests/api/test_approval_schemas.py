"""Agent-supplied `arguments_schema`: refused at the permit when it cannot be checked safely,
and a reviewer's edits checked before the run lock, in a bounded child process.

The stop test uses real threads on PostgreSQL: the decision's check runs while a stop of the
same run is issued, and the stop must finish while the check is still running.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import jsonschema
import jsonschema._keywords
import jsonschema._utils
import pytest
from django.db import connection
from django.test import Client

from runs import services
from runs._arguments_worker import check as worker_check
from runs.actors import Actor
from runs.models import Approval, ApprovalStatus, Run
from runs.services import approvals as approval_services
from tests.support.api import Api, url
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
REDOS = "^(a+)+$"
# 34 characters: at this length Python's backtracking `re` takes minutes on REDOS
TRAP = "a" * 33 + "!"


@pytest.fixture(autouse=True)
def _no_rate_limit(settings):
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 0


def permit(schema: Any, arguments: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "epoch": 1,
        "tool_call_id": extra.pop("tool_call_id", "call_1"),
        "tool": "rename",
        "side_effect": "write",
        "arguments": arguments if arguments is not None else {"name": "x", "note": "y"},
        "needs_approval": True,
        "arguments_schema": schema,
        **extra,
    }


def decide_url(approval_id: str) -> str:
    return f"/api/v1/approvals/{approval_id}/decide/"


def held(api: Api, run: Run, token: Any, schema: Any, arguments: dict[str, Any]) -> str:
    response = api.post(url(run, "permits/"), permit(schema, arguments), token)
    assert response.status_code == 202, response.json()
    return response.json()["approval"]["id"]


# ---------------------------------------------------------------------------------------------
# the permit refuses schemas that cannot be checked safely


@pytest.mark.parametrize(
    ("schema", "code"),
    [
        ({"$ref": "#"}, "schema_ref_loop"),
        ({"$ref": "#/nonexistent"}, "schema_bad_ref"),
        ({"$ref": "#/required", "required": ["a"]}, "schema_bad_ref"),
        (
            {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}}}
            | {"$ref": "#/$defs/a"},
            "schema_ref_loop",
        ),
        ({"$dynamicAnchor": "node", "anyOf": [{"$dynamicRef": "#node"}]}, "schema_ref_loop"),
        ({"not": {"$ref": "#"}}, "schema_ref_loop"),
        ({"$ref": "https://json-schema.org/draft/2020-12/schema"}, "schema_remote_ref"),
        ({"$dynamicRef": "http://example.test/s#meta"}, "schema_remote_ref"),
        ({"$id": "http://example.test/s", "type": "object"}, "schema_unsupported"),
        ({"$schema": "http://json-schema.org/draft-04/schema#"}, "schema_unsupported"),
        ({"properties": {"a": {"pattern": "(a)\\1"}}}, "schema_unsupported_pattern"),
        ({"patternProperties": {"(?=x)": {}}}, "schema_unsupported_pattern"),
        ({"type": "no-such-type"}, "schema_invalid"),
        # past IN_PROCESS_SUBSCHEMAS: checked against the meta-schema in the child process
        (
            {"properties": {f"p{n}": {"type": "string"} for n in range(80)} | {"x": {"type": 5}}},
            "schema_invalid",
        ),
        ({"enum": ["x" * 70_000]}, "schema_too_large"),
    ],
)
def test_a_schema_that_cannot_be_checked_safely_is_refused_at_the_permit(
    api, team, agent_token, schema, code
):
    run, _ = make_running(team)
    response = api.post(url(run, "permits/"), permit(schema), agent_token)
    assert response.status_code == 400, response.json()
    body = response.json()
    assert (body["error"], body["field"]) == (code, "arguments_schema")
    assert not Approval.objects.filter(run=run).exists()
    assert reload(run).tool_calls_count == 0


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"child": {"$ref": "#"}}},  # a tree: fine
        {
            "$defs": {"node": {"$anchor": "node", "type": "array", "items": {"$ref": "#node"}}},
            "properties": {"tree": {"$ref": "#node"}},
        },
        {"properties": {"name": {"type": "string", "pattern": REDOS}}},  # RE2 matches it
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
        {"properties": {f"p{n}": {"type": "string", "maxLength": 9} for n in range(80)}},
    ],
)
def test_local_recursive_and_re2_schemas_are_accepted(api, team, agent_token, schema):
    run, _ = make_running(team)
    response = api.post(url(run, "permits/"), permit(schema), agent_token)
    assert response.status_code == 202, response.json()
    assert Approval.objects.get(run=run).arguments_schema == schema


@pytest.fixture
def silent_listener():
    """A TCP listener that never accepts: a connection would sit in its backlog."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    yield listener
    listener.close()


def _connections(listener: socket.socket) -> int:
    count = 0
    while True:
        try:
            accepted, _ = listener.accept()
        except BlockingIOError:
            return count
        accepted.close()
        count += 1


def test_a_remote_ref_is_refused_and_never_fetched(
    api, team, agent_token, reviewer_token, silent_listener
):
    port = silent_listener.getsockname()[1]
    remote = {"$ref": f"http://127.0.0.1:{port}/schema.json"}
    run, _ = make_running(team)
    response = api.post(url(run, "permits/"), permit(remote), agent_token)
    assert response.status_code == 400
    assert response.json()["error"] == "schema_remote_ref"
    # An approval stored with such a schema (written before the permit checked it) is still
    # never fetched at the decision: the child's registry refuses to retrieve.
    approval_id = held(api, run, agent_token, None, {"name": "x"})
    Approval.objects.filter(pk=services.parse_approval_id(approval_id)).update(
        arguments_schema=remote
    )
    decided = api.post(
        decide_url(approval_id), {"decision": "approve", "arguments": {"name": "z"}}, reviewer_token
    )
    assert decided.status_code == 400, decided.json()
    assert decided.json()["error"] == "arguments_check_failed"
    assert (
        Approval.objects.get(pk=services.parse_approval_id(approval_id)).status
        == ApprovalStatus.WAITING
    )
    assert _connections(silent_listener) == 0


# ---------------------------------------------------------------------------------------------
# the decision: bounded, and outside the run lock


@pytest.mark.timeout(180)
def test_a_redos_pattern_with_a_trap_string_is_answered_by_re2(
    api, team, agent_token, reviewer_token
):
    """The agent's pattern backtracks catastrophically in Python's `re` on the trap string (the
    original arguments); the reviewer edits another field. RE2 answers at once."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": REDOS}, "note": {"type": "string"}},
    }
    run, _ = make_running(team)
    approval_id = held(api, run, agent_token, schema, {"name": TRAP, "note": "first"})
    answer = api.post(
        decide_url(approval_id),
        {"decision": "approve", "arguments": {"name": TRAP, "note": "edited"}},
        reviewer_token,
    )
    assert answer.status_code == 400, answer.json()
    assert answer.json()["error"] == "invalid"
    assert "at name" in answer.json()["detail"]
    fixed = api.post(
        decide_url(approval_id),
        {"decision": "approve", "arguments": {"name": "aaaa", "note": "edited"}},
        reviewer_token,
    )
    assert fixed.status_code == 200, fixed.json()
    assert fixed.json()["arguments"] == {"name": "aaaa", "note": "edited"}


def test_unique_items_over_3000_objects_is_checked(api, team, agent_token, reviewer_token):
    schema = {"type": "object", "properties": {"rows": {"type": "array", "uniqueItems": True}}}
    rows = [{"id": n, "tags": ["a", "b"], "meta": {"n": n}} for n in range(3000)]
    run, _ = make_running(team)
    approval_id = held(api, run, agent_token, schema, {"rows": rows[:2]})
    duplicate = [*rows, {"meta": {"n": 7}, "tags": ["a", "b"], "id": 7.0}]  # == rows[7]
    refused = api.post(
        decide_url(approval_id),
        {"decision": "approve", "arguments": {"rows": duplicate}},
        reviewer_token,
    )
    assert refused.status_code == 400, refused.json()
    assert "non-unique" in refused.json()["detail"]
    accepted = api.post(
        decide_url(approval_id),
        {"decision": "approve", "arguments": {"rows": rows}},
        reviewer_token,
    )
    assert accepted.status_code == 200, accepted.json()


def test_unique_items_is_linear_not_pairwise(monkeypatch):
    """jsonschema compares unhashable items pairwise (4.5 million comparisons for 3,000
    objects); the checker's canonical keys compare none."""
    calls = []
    real_equal = jsonschema._utils.equal
    monkeypatch.setattr(
        jsonschema._utils, "equal", lambda a, b: calls.append(1) or real_equal(a, b)
    )
    # the checker swaps these for RE2 in its own process: restore them after this test
    monkeypatch.setattr(jsonschema._keywords, "re", jsonschema._keywords.re)
    monkeypatch.setattr(jsonschema._utils, "re", jsonschema._utils.re)
    rows = [{"id": n, "meta": {"n": n}} for n in range(3000)]
    schema = {"type": "array", "uniqueItems": True}
    assert worker_check(schema, rows) == {"valid": True}
    assert worker_check(schema, [*rows, {"meta": {"n": 1}, "id": 1}])["valid"] is False
    assert worker_check(schema, [1, True])["valid"] is True  # true is not 1 in JSON
    assert worker_check(schema, [1, 1.0])["valid"] is False
    assert calls == []


def test_edits_too_large_are_refused(api, team, agent_token, reviewer_token, settings):
    run, _ = make_running(team)
    approval_id = held(api, run, agent_token, {"type": "object"}, {"name": "x"})
    settings.SAFESTOP_ARGUMENTS_MAX_BYTES = 1000
    large = api.post(
        decide_url(approval_id),
        {"decision": "approve", "arguments": {"name": "x" * 2000}},
        reviewer_token,
    )
    assert (large.status_code, large.json()["error"]) == (400, "arguments_too_large")
    assert (
        Approval.objects.get(pk=services.parse_approval_id(approval_id)).status
        == ApprovalStatus.WAITING
    )


# A schema that takes exponential time on nested arrays whatever the regex engine: every level
# tries two branches that both fail at the bottom.
EXPONENTIAL = {
    "$defs": {
        "x": {
            "anyOf": [
                {"type": "array", "items": {"$ref": "#/$defs/x"}},
                {"type": "array", "items": {"$ref": "#/$defs/x"}},
            ]
        }
    },
    "properties": {"tree": {"$ref": "#/$defs/x"}},
}


def _nested(depth: int) -> Any:
    value: Any = "leaf"  # a string: neither branch accepts it, so both are always tried
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stop_is_answered_while_a_slow_check_runs(team, reviewer_token, settings, monkeypatch):
    """The decision's check runs before the run lock: a stop of the same run, issued while
    the check is running, finishes before the check does. The check is then killed at its
    time limit or its memory limit (this schema's errors grow with the time spent: which limit
    comes first depends on the machine's speed) and the decision refused."""
    settings.SAFESTOP_ARGUMENTS_CHECK_SECONDS = 10
    run, _lease = make_running(team)
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=1,
        tool_call_id="call_slow",
        tool="rename",
        side_effect="write",
        arguments={"tree": []},
        needs_approval=True,
        arguments_schema=EXPONENTIAL,
        actor=AGENT,
    )
    approval = Approval.objects.get(execution_record=record)
    started, finished = threading.Event(), threading.Event()
    real_check = approval_services.edited_arguments_check

    def observed_check(schema: Any, arguments: Any) -> None:
        started.set()
        try:
            real_check(schema, arguments)
        finally:
            finished.set()

    monkeypatch.setattr(approval_services, "edited_arguments_check", observed_check)
    answers: list[Any] = []

    def decide() -> None:
        try:
            answers.append(
                Client().post(
                    decide_url(approval.public_id),
                    data={"decision": "approve", "arguments": {"tree": _nested(40)}},
                    content_type="application/json",
                    **reviewer_token.header,
                )
            )
        finally:
            connection.close()

    thread = threading.Thread(target=decide)
    thread.start()
    assert started.wait(60)
    outcome = services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.system("test"))
    stopped_while_checking = not finished.is_set()
    thread.join(120)
    assert stopped_while_checking, "the stop waited for the reviewer's check"
    assert outcome.status in ("stopped_cleanly", "stopped_dirty", "cancel_requested", "draining")
    assert reload(run).status == outcome.status
    assert len(answers) == 1
    assert answers[0].status_code == 400
    assert answers[0].json()["error"] in ("arguments_check_timeout", "arguments_check_failed")
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.VOID  # voided by the stop, never approved
