"""Approvals in a real browser: a reviewer opens a held payment from the inbox, edits its
arguments (the editor refuses what is not a JSON object and shows the diff before it lets
them confirm) and approves; a viewer's inbox, open in another browser, loses the row live and
its navigation count drops, without a reload.

The decision goes through the live server (the console), whose channel layer publishes the
frame that the viewer's page follows.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from runs import services
from runs.actors import Actor
from runs.models import Approval, ApprovalStatus, ExecutionState, Lease, Team
from tests.support.browser import in_thread, login, wait_live
from tests.support.scenarios import AGENT, new_run, start

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT = 10_000  # ms
_calls = itertools.count(1)

SCHEMA = {
    "type": "object",
    "properties": {"amount": {"type": "number", "maximum": 500}, "order": {"type": "string"}},
    "required": ["amount", "order"],
}


def collect_errors(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    page.on(
        "console",
        lambda message: (
            errors.append(f"console: {message.text}") if message.type == "error" else None
        ),
    )
    return errors


def held_payment(team: Team) -> Approval:
    run = new_run(team, title="Refund the duplicate charge", agent="billing-bot")
    lease = start(run)
    record, _created = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id=f"refund_{next(_calls)}",
        tool="payments.refund",
        actor=AGENT,
        side_effect="write",
        arguments={"amount": 120, "order": "1042"},
        needs_approval=True,
        summary="Refund order 1042 (charged twice)",
        risk="high",
        arguments_schema=SCHEMA,
    )
    return Approval.objects.get(execution_record_id=record.pk)


def test_a_reviewer_approves_with_an_edit_while_a_viewer_sees_it_leave_the_inbox(
    browser: Browser, page: Page, live_stack, team, bob, charlie, screenshot_dir: Path
) -> None:
    approval = in_thread(held_payment, team)
    other = in_thread(held_payment, team)  # stays waiting: the viewer's count goes 2 → 1

    viewer_context = browser.new_context(viewport={"width": 1280, "height": 800})
    viewer = viewer_context.new_page()
    viewer_errors = collect_errors(viewer)
    errors = collect_errors(page)
    try:
        login(viewer, live_stack.url, "charlie")
        viewer.goto(f"{live_stack.url}/approvals/")
        wait_live(viewer)
        row = viewer.locator(f'tr[data-approval-id="{approval.public_id}"]')
        expect(row).to_contain_text("payments.refund")
        expect(viewer.locator("#nav-approvals-count")).to_contain_text("2")
        viewer.evaluate("window.__noReload = true")

        login(page, live_stack.url, "bob")
        page.goto(f"{live_stack.url}/approvals/")
        wait_live(page)
        page.locator(f'tr[data-approval-id="{approval.public_id}"] a.run-title').click()
        expect(page).to_have_url(f"{live_stack.url}/approvals/{approval.public_id}/")
        expect(page.get_by_test_id("approval-status")).to_have_text("Waiting")
        wait_live(page)

        page.get_by_test_id("edit-open").click()
        editor = page.locator("#edit-arguments")
        confirm = page.get_by_test_id("edit-confirm")
        check = page.locator("#edit-check")
        expect(confirm).to_be_disabled()  # nothing changed yet
        editor.fill('{"amount": 100, "order": ')
        expect(check).to_contain_text("Not valid JSON")
        expect(confirm).to_be_disabled()
        editor.fill("[100]")
        expect(check).to_contain_text("Not a JSON object")
        expect(confirm).to_be_disabled()
        editor.fill('{"order": "1042", "amount": 100}')
        diff = page.get_by_test_id("arguments-diff")
        expect(diff).to_be_visible()
        expect(diff.locator(".diff__line--del")).to_have_text(['-   "amount": 120,'])
        expect(diff.locator(".diff__line--add")).to_have_text(['+   "amount": 100,'])
        expect(confirm).to_be_enabled()
        page.locator("#edit-message").fill("Refund only the duplicate part")
        page.screenshot(path=screenshot_dir / "approval-edit.png", full_page=True, caret="initial")
        confirm.click()

        decision = page.locator("#approval-decision")
        expect(decision).to_contain_text("Approved with your edits", timeout=LIVE_TIMEOUT)
        expect(page.get_by_test_id("final-diff")).to_contain_text('+   "amount": 100,')
        expect(page.get_by_test_id("approval-status")).to_have_text("Approved")
        expect(page.locator("#nav-approvals-count")).to_contain_text("1")  # the other one
        page.screenshot(
            path=screenshot_dir / "approval-approved.png", full_page=True, caret="initial"
        )

        # The viewer's inbox followed, live: the row is gone, the other one stays, the count drops.
        expect(row).to_have_count(0, timeout=LIVE_TIMEOUT)
        expect(viewer.locator(f'tr[data-approval-id="{other.public_id}"]')).to_have_count(1)
        expect(viewer.locator("#nav-approvals-count")).to_contain_text("1")
        assert viewer.evaluate("window.__noReload === true"), "the viewer's page was reloaded"
        expect(viewer.get_by_test_id("approve-open")).to_have_count(0)
        viewer.screenshot(
            path=screenshot_dir / "approvals-inbox-viewer.png", full_page=True, caret="initial"
        )
        assert not viewer_errors, viewer_errors
        assert not errors, errors
    finally:
        viewer_context.close()

    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == "bob"
    assert approval.edited and approval.arguments == {"amount": 100, "order": "1042"}
    assert approval.message == "Refund only the duplicate part"
    record = approval.execution_record
    assert record is not None
    record.refresh_from_db()
    assert record.execution_state == ExecutionState.PERMITTED
    assert record.arguments == {"amount": 100, "order": "1042"}


def test_the_printable_packet_lists_the_approval_the_stop_voided_and_links_to_it(
    page: Page, live_stack, bob, team
):
    """A held payment voided by a stop is in the stop packet a reviewer prints; its link opens
    the approval, which says it was voided and never ran."""
    errors = collect_errors(page)
    approval = in_thread(held_payment, team)
    in_thread(
        services.run_stop,
        run_id=approval.run_id,
        reason="user_stop",
        actor=Actor.for_user(bob),
    )
    lease = in_thread(lambda: Lease.objects.get(run_id=approval.run_id))
    in_thread(
        services.run_drained,
        run_id=approval.run_id,
        lease_token=lease.token,
        epoch=lease.epoch,
        actor=AGENT,
    )
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/runs/{approval.run_id}/packet/")
    voided = page.get_by_test_id("void-approvals")
    expect(voided).to_contain_text("Approvals voided by the stop", timeout=LIVE_TIMEOUT)
    row = voided.locator(f'tr[data-approval-id="{approval.public_id}"]')
    expect(row).to_contain_text("payments.refund")
    expect(row).to_contain_text("never ran")
    row.get_by_role("link", name=approval.public_id).click()
    expect(page).to_have_url(re.compile(rf"/approvals/{approval.public_id}/$"))
    expect(page.locator("main")).to_contain_text("void", ignore_case=True)
    assert not errors, errors
