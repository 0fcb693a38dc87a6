"""Approve as it is, or reject with a message, from the approvals inbox and from Needs me:
through the same form and service as the approval page, for reviewers only, answered in place
(htmx) or by a redirect back to the list (no script). The run page lists its approvals; long
ledger and audit payloads open in place."""

from __future__ import annotations

import pytest

from runs import services
from runs.actors import Actor
from runs.models import ApprovalStatus
from tests.support.approvals import url, waiting
from tests.support.htmx import htmx

pytestmark = pytest.mark.django_db


def test_the_inbox_and_needs_me_offer_both_decisions_for_each_waiting_approval(as_reviewer, team):
    approval = waiting(team)
    decide = url(approval, "decide/inline/")
    for page in ("/approvals/", "/needs-me/"):
        body = as_reviewer.get(page).content.decode()
        assert body.count(f'hx-post="{decide}"') == 2, page
        assert 'data-testid="inline-approve-confirm"' in body
        assert 'name="decision" value="reject"' in body
        assert f'id="inline-reject-{approval.public_id}"' in body


def test_a_viewer_is_offered_nothing_and_refused(as_viewer, team):
    approval = waiting(team)
    assert 'data-testid="inline-decide"' not in as_viewer.get("/approvals/").content.decode()
    response = as_viewer.post(url(approval, "decide/inline/"), {"decision": "approve"})
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.WAITING


def test_approve_in_place_answers_with_what_happened(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.post(
        url(approval, "decide/inline/"),
        {"decision": "approve", "row": "tr", "next": "/approvals/"},
        **htmx(f"approval-row-{approval.public_id}"),
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith(f'<tr id="decided-row-{approval.public_id}"')
    assert "data-flash" in body and "Approved as it was" in body
    assert f'id="decided-{approval.public_id}" tabindex="-1"' in body
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and not approval.edited
    assert approval.decided_by == "bob"


def test_reject_with_a_message_from_needs_me_without_script(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.post(
        url(approval, "decide/inline/"),
        {
            "decision": "reject",
            "message": "Refunds over 100 go through finance.",
            "row": "li",
            "next": "/needs-me/?kind=approval",
        },
    )
    assert response.status_code == 302 and response["Location"] == "/needs-me/?kind=approval"
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED
    assert approval.message == "Refunds over 100 go through finance."
    page = as_reviewer.get(response["Location"]).content.decode()
    assert "Rejected: the call will never run" in page


def test_arguments_never_come_from_a_list(as_reviewer, team):
    approval = waiting(team)
    as_reviewer.post(
        url(approval, "decide/inline/"),
        {"decision": "approve", "arguments": '{"amount": 1}'},
        **htmx("x"),
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and not approval.edited


def test_a_second_decision_is_refused_in_place(as_reviewer, as_admin, team, alice):
    approval = waiting(team)
    services.approval_decide(
        approval_id=approval.pk, decision="approve", actor=Actor.for_user(alice)
    )
    response = as_reviewer.post(
        url(approval, "decide/inline/"), {"decision": "reject", "row": "li"}, **htmx("x")
    )
    body = response.content.decode()
    assert body.lstrip().startswith(f'<li id="decided-row-{approval.public_id}"')
    assert 'role="alert"' in body and "alice" in body
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED


def test_a_bad_decision_is_a_message_not_a_500(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.post(url(approval, "decide/inline/"), {"decision": "maybe"}, **htmx())
    assert response.status_code == 200 and 'role="alert"' in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.WAITING


def test_the_way_back_is_only_a_page_of_this_site(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.post(
        url(approval, "decide/inline/"),
        {"decision": "approve", "next": "https://evil.example/phish"},
    )
    assert response["Location"] == "/approvals/"
    other = waiting(team, title="Second refund")
    response = as_reviewer.post(
        url(other, "decide/inline/"), {"decision": "approve", "next": "//evil.example/x"}
    )
    assert response["Location"] == "/approvals/"


def test_the_run_page_lists_the_runs_approvals(as_viewer, team, alice):
    approval = waiting(team)
    services.approval_decide(
        approval_id=approval.pk,
        decision="reject",
        actor=Actor.for_user(alice),
        message="no",
    )
    body = as_viewer.get(f"/runs/{approval.run_id}/").content.decode()
    section = body[body.index('id="run-approvals"') :]
    section = section[: section.index("</section>")]
    assert f'href="/approvals/{approval.public_id}/"' in section
    assert "rejected" in section and "alice" in section
    assert (approval.rule_name or "asked by the agent") in section


def test_a_long_payload_opens_in_place(as_admin, team, alice):
    approval = waiting(team)
    long_note = "x" * 400
    services.approval_decide(
        approval_id=approval.pk, decision="reject", actor=Actor.for_user(alice), message=long_note
    )
    run_page = as_admin.get(f"/runs/{approval.run_id}/").content.decode()
    assert '<details class="payload-more">' in run_page and long_note in run_page
    audit = as_admin.get(f"/audit/?run={approval.run_id}").content.decode()
    assert '<details class="payload-more">' in audit
