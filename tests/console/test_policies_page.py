"""`/policies/`: team admins create, edit, delete and test policies; viewers and reviewers
read them, their errors and their hits; a bad expression is refused at its field."""

from __future__ import annotations

import pytest

from policies.models import Policy
from runs.models import ExecutionState
from tests.support.policies import permit, policy, result
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db


def _edit(**overrides):
    data = _post(**overrides)
    del data["team"]
    return data


def _post(**overrides):
    data = {
        "team": "acme",
        "name": "loop",
        "expression": "call.repeats >= 3",
        "action": "stop",
        "mode": "enforce",
        "on_error": "require_approval",
        "agent_glob": "*",
        "tool_glob": "*",
        "enabled": "on",
    }
    data.update(overrides)
    return data


def test_an_admin_creates_a_policy_from_a_template(as_admin, team):
    page = as_admin.get("/policies/?template=failure-streak").content.decode()
    assert "run.tool_failures_in_a_row &gt;= 3" in page
    for key in ("loop", "spend", "running-too-long", "side-effect-burst", "destination-allow-list"):
        assert f"?template={key}" in page
    created = as_admin.post("/policies/", _post())
    assert created.status_code == 302
    saved = Policy.objects.get()
    assert created["Location"] == f"/policies/{saved.pk}/"
    assert (saved.expression, saved.mode, saved.created_by) == (
        "call.repeats >= 3",
        "enforce",
        "alice",
    )


def test_a_bad_expression_is_refused_at_the_field_with_line_and_column(as_admin, team):
    refused = as_admin.post("/policies/", _post(expression="run.steps > 1 &&\n  nope"))
    assert refused.status_code == 400
    body = refused.content.decode()
    assert 'id="p-expression-error"' in body
    assert "line 2, column 3" in body and "nope" in body
    assert not Policy.objects.exists()


def test_an_admin_edits_and_deletes(as_admin, team):
    saved = policy(team, "loop", "call.repeats >= 3")
    edited = as_admin.post(f"/policies/{saved.pk}/", _edit(expression="call.repeats >= 4"))
    assert edited.status_code == 302
    saved.refresh_from_db()
    assert saved.expression == "call.repeats >= 4"
    bad = as_admin.post(f"/policies/{saved.pk}/", _edit(expression="call.repeats"))
    assert bad.status_code == 400 and "must be a boolean" in bad.content.decode()
    assert as_admin.post(f"/policies/{saved.pk}/delete/").status_code == 302
    assert not Policy.objects.exists()


def test_viewers_and_reviewers_read_but_do_not_write(as_viewer, as_reviewer, team):
    saved = policy(team, "needs-amount", "call.arguments.amount > 100")
    run, _lease = make_running(team)
    permit(run, "c1", side_effect="write", arguments={})  # an evaluation error
    for client in (as_viewer, as_reviewer):
        listing = client.get("/policies/").content.decode()
        assert "needs-amount" in listing and "New policy" not in listing
        page = client.get(f"/policies/{saved.pk}/").content.decode()
        assert "Evaluation errors" in page and "amount" in page  # the error is shown
        assert "Test against history" not in page
        assert client.post("/policies/", _post()).status_code == 403
        assert client.post(f"/policies/{saved.pk}/", _edit()).status_code == 403
        assert client.post(f"/policies/{saved.pk}/delete/").status_code == 403
        assert client.post(f"/policies/{saved.pk}/test/", {"days": 7}).status_code == 403


def test_an_outsider_sees_no_policy(as_outsider, team):
    saved = policy(team, "acme-secret-rule", "call.repeats >= 3")
    assert as_outsider.get(f"/policies/{saved.pk}/").status_code == 404
    assert "acme-secret-rule" not in as_outsider.get("/policies/").content.decode()


def test_test_against_history_on_the_page(as_admin, team):
    saved = policy(team, "streak", "run.tool_failures_in_a_row >= 2", mode="observe")
    run, _lease = make_running(team)
    for n in range(2):
        permit(run, f"c{n}", arguments={"n": n})
        result(run, f"c{n}", ExecutionState.FAILED)
    answer = as_admin.post(f"/policies/{saved.pk}/test/", {"days": 3})
    assert answer.status_code == 200
    body = answer.content.decode()
    assert "It would have acted on 1 of 1 runs" in body
    assert f"/runs/{run.pk}/" in body
    assert as_admin.post(f"/policies/{saved.pk}/test/", {"days": 0}).status_code == 400
