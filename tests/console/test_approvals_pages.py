"""The approvals console (DESIGN §10): the inbox (sorted, filtered, scoped, a constant number of
queries), one approval's page and its decisions (approve, approve with edits checked against
the agent's schema, reject), the waiting approval on the run and runs pages, the count in the
navigation, and the rules page (admins write; everyone else reads)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils.html import escape

from runs import services
from runs.actors import Actor
from runs.models import (
    Approval,
    ApprovalRule,
    ApprovalStatus,
    ExecutionState,
    LedgerEntry,
)
from tests.support.approvals import SCHEMA, rule, url, waiting
from tests.support.htmx import htmx
from tests.support.scenarios import AGENT, new_run

pytestmark = pytest.mark.django_db

# ---------------------------------------------------------------- inbox


def test_inbox_lists_waiting_approvals_soonest_deadline_first(as_reviewer, team):
    rule(team, "deploys", tool_glob="deploy.*", timeout_seconds=60)
    rule(team, "payments", tool_glob="payments.*", timeout_seconds=600)
    rule(team, "mail", tool_glob="mail.*", timeout_seconds=3000)
    late = waiting(team, tool="mail.send")
    soon = waiting(team, tool="deploy.push")
    middle = waiting(team, tool="payments.refund")
    response = as_reviewer.get("/approvals/")
    assert response.status_code == 200
    assert [a.pk for a in response.context["rows"]] == [soon.pk, middle.pk, late.pk]
    body = response.content.decode()
    # the one about to expire stands out; the others do not
    assert (
        f'data-approval-id="{soon.public_id}" data-status="waiting" class="row--attention is-soon"'
        in body
    )
    assert f'data-approval-id="{middle.public_id}" data-status="waiting" class=""' in body
    assert "data-countdown" in body  # time left, kept current by console.js
    assert '<td class="small" data-label="Why">deploys</td>' in body  # the rule that holds it


def test_inbox_filters_by_team_agent_tool_and_risk(as_staff, team, other_team):
    refund = waiting(team, tool="payments.refund", agent="billing-bot", risk="high")
    deploy = waiting(team, tool="deploy.push", agent="deployer", risk="medium")
    theirs = waiting(other_team, tool="payments.charge", agent="billing-bot", risk="low")

    def ids(**query: str) -> set[int]:
        return {a.pk for a in as_staff.get("/approvals/", query).context["rows"]}

    assert ids() == {refund.pk, deploy.pk, theirs.pk}
    assert ids(team="acme") == {refund.pk, deploy.pk}
    assert ids(agent="billing-bot") == {refund.pk, theirs.pk}
    assert ids(tool="payments") == {refund.pk, theirs.pk}
    assert ids(risk="medium") == {deploy.pk}
    assert ids(team="acme", agent="billing-bot", risk="high") == {refund.pk}
    assert ids(team="no-such-team") == set()
    assert ids(run=deploy.run_id) == {deploy.pk}


def test_decided_approvals_have_their_own_tabs(as_reviewer, team, bob):
    decided = waiting(team)
    still = waiting(team)
    services.approval_decide(
        approval_id=decided.pk, decision="reject", actor=Actor.for_user(bob), message="no"
    )
    assert [a.pk for a in as_reviewer.get("/approvals/").context["rows"]] == [still.pk]
    rejected = as_reviewer.get("/approvals/", {"status": "rejected"})
    assert [a.pk for a in rejected.context["rows"]] == [decided.pk]
    assert "by bob" in rejected.content.decode()
    every = as_reviewer.get("/approvals/", {"status": "all"}).context["rows"]
    assert {a.pk for a in every} == {decided.pk, still.pk}


def test_inbox_shows_only_my_teams(as_reviewer, as_outsider, team, other_team):
    mine = waiting(team, summary="acme refund")
    theirs = waiting(other_team, summary="globex secret refund")
    body = as_reviewer.get("/approvals/").content.decode()
    assert mine.public_id in body and theirs.public_id not in body
    assert "globex secret" not in body
    # a team the user is not in, named in the filter, shows nothing (not another team's rows)
    assert list(as_reviewer.get("/approvals/", {"team": "globex"}).context["rows"]) == []
    assert theirs.public_id in as_outsider.get("/approvals/").content.decode()


def test_htmx_refresh_returns_the_table_and_the_nav_count(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.get("/approvals/", **htmx("approvals-region"))
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert body.lstrip().startswith('<section id="approvals-region"')
    assert approval.public_id in body
    assert 'id="nav-approvals-count" class="nav-count" hx-swap-oob="true">1<' in body
    assert 'id="f-status" hx-swap-oob="true"' in body  # the tab follows into the filter form
    assert "HX-Request" in response["Vary"]


def test_inbox_queries_do_not_grow_with_approvals(as_reviewer, team, django_assert_max_num_queries):
    waiting(team)
    with CaptureQueriesContext(connection) as one:
        assert as_reviewer.get("/approvals/").status_code == 200
    for i in range(29):
        waiting(team, agent=f"agent-{i % 7}", tool=f"tool.{i}")
    with CaptureQueriesContext(connection) as thirty:
        response = as_reviewer.get("/approvals/")
    assert len(response.context["rows"]) == 30
    assert len(thirty) == len(one)
    with django_assert_max_num_queries(len(one)):
        as_reviewer.get("/approvals/", **htmx("approvals-region"))


def test_the_navigation_counts_waiting_approvals_on_every_page(as_reviewer, as_outsider, team):
    waiting(team)
    waiting(team)
    body = as_reviewer.get("/").content.decode()
    assert 'id="nav-approvals-count" class="nav-count" >2<' in body
    other = as_outsider.get("/handoffs/").content.decode()
    assert 'id="nav-approvals-count" class="nav-count is-zero" >0<' in other


# ---------------------------------------------------------------- one approval


def test_approval_page_shows_the_run_the_call_the_rule_and_why(as_reviewer, team):
    rule(team, "Refunds need a person", tool_glob="payments.*", side_effect="write")
    approval = waiting(team, arguments={"amount": 120, "order": "1042"})
    response = as_reviewer.get(url(approval))
    body = response.content.decode()
    assert response.status_code == 200
    assert "payments.refund" in body and "Refund order 1042" in body
    assert "Refunds need a person" in body and escape(approval.match_reason) in body
    assert f'href="/runs/{approval.run_id}/"' in body and "Customer refunds" in body
    assert "&quot;amount&quot;: 120" in body  # pretty-printed arguments
    assert 'data-testid="approve-open"' in body and 'data-testid="edit-open"' in body
    assert 'data-testid="reject-open"' in body
    assert 'id="approval-original-arguments"' in body  # for the editor's diff
    assert "/static/console/approvals.js" in body
    # the id without its prefix works too
    assert as_reviewer.get(f"/approvals/{approval.pk}/").status_code == 200


def test_another_teams_approval_is_not_found(as_outsider, team):
    approval = waiting(team)
    assert as_outsider.get(url(approval)).status_code == 404
    response = as_outsider.post(url(approval, "decide/"), {"decision": "approve"})
    assert response.status_code == 404
    assert as_outsider.get("/approvals/appr_999999/").status_code == 404
    assert as_outsider.get("/approvals/nonsense/").status_code == 404
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.WAITING


def test_a_viewer_sees_no_buttons_and_cannot_decide(as_viewer, team):
    approval = waiting(team)
    body = as_viewer.get(url(approval)).content.decode()
    assert "approve-open" not in body and "reject-open" not in body
    assert "needs the reviewer role" in body
    for data in ({"decision": "approve"}, {"decision": "reject", "message": "no"}):
        assert as_viewer.post(url(approval, "decide/"), data).status_code == 403
        assert as_viewer.post(url(approval, "decide/"), data, **htmx()).status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.WAITING


def test_reviewer_approves_as_is(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.post(url(approval, "decide/"), {"decision": "approve"})
    assert response.status_code == 302 and response["Location"] == url(approval)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == "bob"
    assert not approval.edited
    assert approval.execution_record.execution_state == ExecutionState.PERMITTED
    page = as_reviewer.get(url(approval)).content.decode()
    assert "Approved as it was" in page and "approve-open" not in page
    assert "Final arguments — as asked" in page


def test_reviewer_approves_with_edits_and_sees_the_diff(as_reviewer, team):
    approval = waiting(team, arguments={"amount": 120, "order": "1042"}, schema=SCHEMA)
    response = as_reviewer.post(
        url(approval, "decide/"),
        {
            "decision": "approve",
            "arguments": '{"amount": 100, "order": "1042"}',
            "message": "partial refund",
        },
        **htmx("approval-decision"),
    )
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert body.lstrip().startswith('<section id="approval-decision"')
    assert "Approved with your edits" in body
    assert '<span class="diff__line diff__line--del">-   &quot;amount&quot;: 120,' in body
    assert '<span class="diff__line diff__line--add">+   &quot;amount&quot;: 100,' in body
    assert 'id="approval-status"' in body and 'hx-swap-oob="true"' in body  # the status follows
    assert 'id="nav-approvals-count" class="nav-count is-zero" hx-swap-oob="true">0<' in body
    approval.refresh_from_db()
    assert approval.edited and approval.arguments == {"amount": 100, "order": "1042"}
    assert approval.original_arguments == {"amount": 120, "order": "1042"}
    assert approval.execution_record.arguments == {"amount": 100, "order": "1042"}
    entry = LedgerEntry.objects.get(run=approval.run, action="approval.approved")
    assert entry.actor == "bob"
    assert entry.payload["original_arguments"]["amount"] == 120
    assert entry.payload["arguments"]["amount"] == 100


def test_edits_that_break_the_schema_are_shown_on_the_form(as_reviewer, team):
    approval = waiting(team, schema=SCHEMA)
    edited = '{"amount": 9999, "order": "1042"}'
    # without htmx: the page again, 400, the reviewer's text kept and the schema's reason shown
    response = as_reviewer.post(
        url(approval, "decide/"), {"decision": "approve", "arguments": edited}
    )
    body = response.content.decode()
    assert response.status_code == 400
    assert "do not match the schema at amount" in body
    assert 'data-testid="arguments-error"' in body
    assert "&quot;amount&quot;: 9999" in body  # what was typed, not the original
    assert '<details class="confirm" open>' in body  # the edit form is open
    # with htmx: the decision region with the same message (200, so htmx swaps it)
    fragment = as_reviewer.post(
        url(approval, "decide/"),
        {"decision": "approve", "arguments": edited},
        **htmx("approval-decision"),
    )
    assert fragment.status_code == 200
    assert "do not match the schema at amount" in fragment.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.WAITING and approval.arguments["amount"] == 120
    assert not LedgerEntry.objects.filter(run=approval.run, action="approval.approved").exists()


@pytest.mark.parametrize(
    ("text", "reason"),
    [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object"), ('"x"', "JSON object")],
)
def test_arguments_that_are_not_a_json_object_are_a_form_error(as_reviewer, team, text, reason):
    approval = waiting(team)
    response = as_reviewer.post(
        url(approval, "decide/"), {"decision": "approve", "arguments": text}
    )
    assert response.status_code == 400 and reason in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.WAITING


def test_reviewer_rejects_with_a_message(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.post(
        url(approval, "decide/"),
        {"decision": "reject", "message": "Order 1042 was already refunded"},
        **htmx("approval-decision"),
    )
    body = response.content.decode()
    assert response.status_code == 200 and "Rejected" in body
    assert "Order 1042 was already refunded" in body
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED
    assert approval.message == "Order 1042 was already refunded"
    assert approval.execution_record.execution_state == ExecutionState.NOT_STARTED


def test_a_message_is_optional_on_a_rejection(as_reviewer, team):
    approval = waiting(team)
    response = as_reviewer.post(url(approval, "decide/"), {"decision": "reject"})
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED and approval.message == ""


def test_a_second_decision_is_refused_and_shows_the_first(as_reviewer, as_admin, team, alice):
    approval = waiting(team)
    services.approval_decide(
        approval_id=approval.pk, decision="reject", actor=Actor.for_user(alice), message="no"
    )
    response = as_reviewer.post(url(approval, "decide/"), {"decision": "approve"}, follow=True)
    body = response.content.decode()
    assert "already rejected by alice" in body
    assert "approve-open" not in body and "Outcome" in body
    fragment = as_reviewer.post(
        url(approval, "decide/"), {"decision": "approve"}, **htmx("approval-decision")
    ).content.decode()
    assert "already rejected by alice" in fragment
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED and approval.decided_by == "alice"


def test_a_decided_approval_replaces_the_forms_when_its_status_is_refetched(
    as_reviewer, team, alice
):
    approval = waiting(team)
    waiting_status = as_reviewer.get(url(approval), **htmx("approval-status")).content.decode()
    assert 'id="approval-decision"' not in waiting_status  # a half-typed edit is left alone
    services.approval_decide(
        approval_id=approval.pk, decision="approve", actor=Actor.for_user(alice)
    )
    body = as_reviewer.get(url(approval), **htmx("approval-status")).content.decode()
    assert body.lstrip().startswith('<section id="approval-status"')
    assert 'id="approval-decision"' in body and "approve-open" not in body
    assert "Why it waits" in body and 'id="nav-approvals-count"' in body


def test_a_stop_voids_the_approval_and_its_page_says_so(as_reviewer, team, bob):
    approval = waiting(team)
    services.run_stop(run_id=approval.run_id, reason="user_stop", actor=Actor.for_user(bob))
    response = as_reviewer.post(url(approval, "decide/"), {"decision": "approve"}, follow=True)
    body = response.content.decode()
    assert "voided" in body and "Void" in body
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.VOID


# ---------------------------------------------------------------- run and runs pages


def test_the_run_page_shows_the_waiting_approval(as_viewer, team):
    approval = waiting(team)
    body = as_viewer.get(f"/runs/{approval.run_id}/").content.decode()
    assert 'data-testid="run-approvals"' in body and f'href="{url(approval)}"' in body
    summary = as_viewer.get(f"/runs/{approval.run_id}/", **htmx("run-summary")).content.decode()
    assert f'href="{url(approval)}"' in summary  # live: it rides on the summary region


def test_the_runs_page_marks_runs_waiting_for_approval(as_viewer, team):
    approval = waiting(team)
    quiet = new_run(team, title="Nothing held")
    body = as_viewer.get("/").content.decode()
    assert f'href="/approvals/?run={approval.run_id}">waiting for approval</a>' in body
    assert body.count("waiting for approval</a>") == 1
    assert quiet.pk in body


# ---------------------------------------------------------------- rules


def _rule_post(**overrides: Any) -> dict[str, Any]:
    data = {
        "team": "acme",
        "name": "Payments need a person",
        "enabled": "on",
        "position": "10",
        "applies_to": "tool_call",
        "tool_glob": "payments.*",
        "side_effect": "write",
        "agent_glob": "",
        "transport": "",
        "destination_glob": "",
        "risk": "high",
        "timeout_seconds": "900",
        "escalate_after_seconds": "300",
    }
    data.update(overrides)
    return data


def test_an_admin_creates_a_rule_and_it_is_ledgered(as_admin, team):
    response = as_admin.post("/approvals/rules/", _rule_post())
    assert response.status_code == 302
    created = ApprovalRule.objects.get(team=team)
    assert created.name == "Payments need a person" and created.tool_glob == "payments.*"
    assert created.escalate_after_seconds == 300 and created.created_by == "alice"
    entry = LedgerEntry.objects.get(action="approval_rule.created")
    assert entry.team_slug == "acme" and entry.actor == "alice"
    body = as_admin.get("/approvals/rules/").content.decode()
    assert "Payments need a person" in body and "15 min" in body and "5 min" in body


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"tool_glob": "payments.[abc"}, "tool_glob", "unbalanced"),
        (
            {"applies_to": "outbox", "tool_glob": "", "side_effect": "", "destination_glob": "[x"},
            "destination_glob",
            "unbalanced",
        ),
        (
            {"applies_to": "outbox", "tool_glob": "", "side_effect": "", "transport": "pigeon"},
            "transport",
            "unknown transport",
        ),
        ({"escalate_after_seconds": "900"}, "escalate_after_seconds", "less than timeout"),
        ({"timeout_seconds": "0"}, "timeout_seconds", "greater than or equal to 1"),
        ({"timeout_seconds": "999999"}, "timeout_seconds", "less than or equal to 86400"),
        ({"transport": "email"}, "transport", "tool calls"),
        ({"risk": "extreme"}, "risk", "valid choice"),
        ({"tool_name": "payments.*"}, "__all__", "unknown field: tool_name"),
    ],
)
def test_bad_rules_are_form_errors(as_admin, team, overrides, field, message):
    response = as_admin.post("/approvals/rules/", _rule_post(**overrides))
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert field in errors, errors
    assert message in " ".join(errors[field]), errors
    assert "The rule was not saved" in response.content.decode()
    assert not ApprovalRule.objects.exists()
    assert not LedgerEntry.objects.filter(action="approval_rule.created").exists()


def test_a_duplicate_rule_name_is_a_form_error(as_admin, team):
    rule(team, "Payments need a person", tool_glob="payments.*")
    response = as_admin.post("/approvals/rules/", _rule_post())
    assert response.status_code == 400
    assert "already has a rule named" in " ".join(response.context["form"].errors["name"])


def test_reviewers_and_viewers_read_rules_but_cannot_write_them(as_reviewer, as_viewer, team):
    existing = rule(team, "Deploys", tool_glob="deploy.*")
    for client in (as_reviewer, as_viewer):
        body = client.get("/approvals/rules/").content.decode()
        assert "Deploys" in body and "deploy.*" in body
        assert "Create rule" not in body and "Edit</a>" not in body and "Delete…" not in body
        assert client.post("/approvals/rules/", _rule_post()).status_code == 403
        assert client.get(f"/approvals/rules/{existing.pk}/").status_code == 403
        assert client.post(f"/approvals/rules/{existing.pk}/", _rule_post()).status_code == 403
        assert client.post(f"/approvals/rules/{existing.pk}/delete/").status_code == 403
    assert list(ApprovalRule.objects.values_list("name", flat=True)) == ["Deploys"]


def test_an_admin_edits_and_deletes_a_rule(as_admin, team):
    existing = rule(team, "Deploys", tool_glob="deploy.*", timeout_seconds=600)
    form = as_admin.get(f"/approvals/rules/{existing.pk}/").content.decode()
    assert 'value="deploy.*"' in form and 'value="600"' in form
    data = _rule_post(name="Deploys", tool_glob="deploy.prod.*", timeout_seconds="1200")
    data.pop("team")
    assert as_admin.post(f"/approvals/rules/{existing.pk}/", data).status_code == 302
    existing.refresh_from_db()
    assert existing.tool_glob == "deploy.prod.*" and existing.timeout_seconds == 1200
    update = LedgerEntry.objects.get(action="approval_rule.updated")
    assert update.payload["changes"]["tool_glob"] == {"from": "deploy.*", "to": "deploy.prod.*"}
    bad = as_admin.post(f"/approvals/rules/{existing.pk}/", {**data, "agent_glob": "[oops"})
    assert bad.status_code == 400 and "unbalanced" in bad.content.decode()
    assert as_admin.post(f"/approvals/rules/{existing.pk}/delete/").status_code == 302
    assert not ApprovalRule.objects.exists()
    assert LedgerEntry.objects.get(action="approval_rule.deleted").payload["name"] == "Deploys"


def test_another_teams_rule_is_not_found(as_outsider, team):
    existing = rule(team, "Deploys", tool_glob="deploy.*")
    assert "Deploys" not in as_outsider.get("/approvals/rules/").content.decode()
    assert as_outsider.get(f"/approvals/rules/{existing.pk}/").status_code == 404
    assert as_outsider.post(f"/approvals/rules/{existing.pk}/delete/").status_code == 404
    # and an admin of another team cannot create one for this team
    response = as_outsider.post("/approvals/rules/", _rule_post(team="acme"))
    assert response.status_code == 400 and "team" in response.context["form"].errors
    assert "Select a valid choice" in response.content.decode()  # shown next to the team
    assert ApprovalRule.objects.count() == 1


def test_a_rule_holds_matching_calls_and_the_approval_says_why(as_admin, team):
    as_admin.post("/approvals/rules/", _rule_post(agent_glob="billing-*"))
    approval = waiting(team, agent="billing-bot")
    assert approval.rule_name == "Payments need a person"
    body = as_admin.get(url(approval)).content.decode()
    assert "Payments need a person" in body and "payments.*" in body


# ---------------------------------------------------------------- Django admin


def test_staff_edit_rules_in_the_django_admin_through_the_services(as_staff, team):
    response = as_staff.post(
        "/admin/runs/approvalrule/add/",
        {
            "team": team.pk,
            "name": "From the admin",
            "enabled": "on",
            "position": "5",
            "applies_to": "any",
            "tool_glob": "payments.[x",
            "side_effect": "",
            "agent_glob": "",
            "transport": "",
            "destination_glob": "",
            "risk": "low",
            "timeout_seconds": "900",
            "escalate_after_seconds": "",
        },
    )
    assert response.status_code == 200 and "unbalanced" in response.content.decode()
    assert not ApprovalRule.objects.exists()
    response = as_staff.post(
        "/admin/runs/approvalrule/add/",
        {
            "team": team.pk,
            "name": "From the admin",
            "enabled": "on",
            "position": "5",
            "applies_to": "any",
            "tool_glob": "payments.*",
            "side_effect": "",
            "agent_glob": "",
            "transport": "",
            "destination_glob": "",
            "risk": "low",
            "timeout_seconds": "900",
            "escalate_after_seconds": "",
        },
    )
    assert response.status_code == 302
    created = ApprovalRule.objects.get()
    assert created.created_by == "root"
    assert LedgerEntry.objects.filter(action="approval_rule.created", actor="root").exists()


def test_approvals_are_read_only_in_the_django_admin(as_staff, team):
    approval = waiting(team)
    assert as_staff.get("/admin/runs/approval/").status_code == 200
    assert as_staff.get(f"/admin/runs/approval/{approval.pk}/change/").status_code == 200
    assert as_staff.get("/admin/runs/approval/add/").status_code == 403
    response = as_staff.post(f"/admin/runs/approval/{approval.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert Approval.objects.filter(pk=approval.pk).exists()


def test_the_steps_timeline_follows_the_run_while_the_approval_waits(as_reviewer, team):
    approval = waiting(team)
    key = approval.run.steps.order_by("seq").first().key
    before = as_reviewer.get(url(approval), **htmx("approval-status")).content.decode()
    assert (
        'id="approval-steps" class="panel" aria-labelledby="context-title" hx-swap-oob="true"'
        in (before)
    )
    lease = approval.run.leases.filter(released_at__isnull=True).get()
    services.events_ingest(
        run_id=approval.run_id,
        epoch=lease.epoch,
        actor=AGENT,
        events=[
            {"event_id": "later-step", "type": "step.started", "key": key, "kind": "tool_read"}
        ],
    )
    after = as_reviewer.get(url(approval), **htmx("approval-status")).content.decode()
    steps = after[after.index('id="approval-steps"') :]
    assert 'id="approval-step-1" class="timeline__item timeline__item--running"' in steps
    assert steps != before[before.index('id="approval-steps"') :]


def test_an_expired_email_approval_says_the_email_was_never_sent(as_reviewer, team):
    from datetime import timedelta

    from django.utils import timezone

    from tests.support.scenarios import start

    run = new_run(team, title="Mail the customer")
    lease = start(run)
    services.outbox_enqueue(
        run_id=run.pk,
        epoch=lease.epoch,
        transport="email",
        destination="customer@example.org",
        payload={"subject": "Your refund", "body": "Done."},
        idempotency_key="mail-1",
        actor=AGENT,
        needs_approval=True,
    )
    approval = Approval.objects.get(run=run)
    services.approval_expire(approval_id=approval.pk, now=timezone.now() + timedelta(days=2))
    body = as_reviewer.get(url(approval)).content.decode()
    assert "the e-mail was never sent" in body
    assert "The call never ran" not in body
