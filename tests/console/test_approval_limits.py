"""The approval page under hostile sizes: deeply nested JSON typed into the decide form is a
form error (not a RecursionError and a 500), and the diff of many edited lines is bounded."""

from __future__ import annotations

import difflib

import pytest

from console.views.approvals import DIFF_MAX_LINES, arguments_diff
from runs import services
from runs.actors import Actor
from runs.models import ApprovalStatus
from tests.support.approvals import url, waiting

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,  # past Python's recursion limit in json.loads
        '{"a": ' + "[" * 70 + "1" + "]" * 70 + "}",  # parses, but deeper than the API allows
    ],
)
def test_deeply_nested_arguments_are_a_form_error(as_reviewer, team, text):
    approval = waiting(team)
    response = as_reviewer.post(
        url(approval, "decide/"), {"decision": "approve", "arguments": text}
    )
    assert response.status_code == 400
    assert "nested deeper than 64 levels" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.WAITING


def test_the_diff_of_2000_edited_keys_is_capped(as_reviewer, team, bob, monkeypatch):
    before = {f"key_{n:04}": n for n in range(2000)}
    after = {f"key_{n:04}": n + 1 for n in range(2000)}
    approval = waiting(team, arguments=before)
    services.approval_decide(
        approval_id=approval.pk, decision="approve", actor=Actor.for_user(bob), arguments=after
    )
    # difflib.ndiff scores every pair of lines in a replaced block against each other (4,000 x
    # 4,000 here): count the line pairs compared.
    pairs = []
    real = difflib.SequenceMatcher.set_seq1
    monkeypatch.setattr(
        difflib.SequenceMatcher, "set_seq1", lambda self, a: pairs.append(1) or real(self, a)
    )
    body = as_reviewer.get(url(approval)).content.decode()
    assert len(pairs) <= 2
    assert body.count("diff__line--del") + body.count("diff__line--add") == DIFF_MAX_LINES
    assert "3600 more changed lines not shown" in body


def test_the_diff_keeps_its_context_and_order():
    diff = arguments_diff({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "c": 3, "d": 4})
    assert [(line.op, line.text) for line in diff] == [
        (" ", "{"),
        (" ", '  "a": 1,'),
        ("-", '  "b": 2,'),
        ("-", '  "c": 3'),
        ("+", '  "b": 5,'),
        ("+", '  "c": 3,'),
        ("+", '  "d": 4'),
        (" ", "}"),
    ]
