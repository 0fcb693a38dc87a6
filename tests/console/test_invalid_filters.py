"""A filter that cannot be read narrows to nothing and says why; it never widens the result
(an export of one actor's entries must not become an export of the whole ledger)."""

from __future__ import annotations

import pytest

from runs.models import LedgerEntry
from tests.support.scenarios import make_run, make_running

pytestmark = pytest.mark.django_db


def test_an_invalid_audit_date_shows_the_error_at_its_field_and_no_rows(as_admin, team):
    make_running(team)
    assert LedgerEntry.objects.count() > 1
    html = as_admin.get(
        "/audit/", {"actor": "reviewer", "until": "2026-13-45T99:99"}
    ).content.decode()
    assert 'data-testid="filter-errors"' in html
    assert 'data-filter-error="until"' in html
    assert '<a href="#a-until">' in html
    assert 'id="a-until" name="until" aria-invalid="true"' in html
    assert "No ledger entries match." in html  # the table is empty
    assert 'value="reviewer"' in html  # what was typed stays in its field


def test_an_invalid_filter_with_a_valid_one_shows_nothing(as_admin, team):
    make_running(team)
    html = as_admin.get("/audit/", {"since": "notadate", "run": "xyz"}).content.decode()
    assert 'data-filter-error="since"' in html
    assert '<td class="num mono">' not in html  # no entry row at all


def test_the_audit_export_of_an_invalid_filter_is_400_with_the_errors(as_admin, team):
    make_running(team)
    response = as_admin.get("/audit.csv", {"actor": "alice", "until": "2026-13-45T99:99"})
    assert response.status_code == 400
    body = response.content.decode()
    assert "nothing was exported" in body
    assert "Until:" in body
    valid = as_admin.get("/audit.csv", {"actor": "nobody-at-all"})
    assert valid.status_code == 200
    lines = b"".join(valid.streaming_content).decode().splitlines()
    assert len(lines) == 1  # the header, and no entry of anybody else


def test_an_unknown_run_status_shows_no_runs(as_reviewer, team):
    make_run(team)
    make_running(team)
    html = as_reviewer.get("/", {"status": "bogus"}).content.decode()
    assert 'data-filter-error="status"' in html
    assert 'data-run-id="' not in html
    assert html.count('name="ids"') == 0


def test_an_unknown_approval_risk_shows_no_approvals(as_reviewer, team):
    html = as_reviewer.get("/approvals/", {"risk": "apocalyptic"}).content.decode()
    assert 'data-filter-error="risk"' in html


def test_an_unknown_handoff_sort_shows_no_handoffs(as_reviewer, team):
    html = as_reviewer.get("/handoffs/", {"sort": "sideways"}).content.decode()
    assert 'data-filter-error="sort"' in html


def test_an_unknown_delivery_status_shows_no_deliveries(as_admin, team):
    html = as_admin.get("/notifications/deliveries/", {"status": "exploded"}).content.decode()
    assert 'data-filter-error="status"' in html
    assert "exploded is not a delivery status." in html


def test_the_audit_reason_menu_lists_reasons_not_reviewers_messages(as_admin, team, alice):
    from runs import services as run_services
    from runs.actors import Actor
    from tests.support.approvals import waiting

    approval = waiting(team)
    run_services.approval_decide(
        approval_id=approval.pk,
        decision="reject",
        actor=Actor.for_user(alice),
        message="Please ask finance first",
    )
    response = as_admin.get("/audit/")
    reasons = list(response.context["reasons"])
    assert "Please ask finance first" not in reasons
    assert "asked_by_agent" in reasons  # the request's own reason is a reason
