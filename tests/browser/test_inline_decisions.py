"""Daily handling in a real browser: Needs me grouped by kind (approvals first, by deadline)
with counts that agree with the navigation's badge, which follows on other pages too; approve
as it is or reject with a message from the approvals inbox and from Needs me, by keyboard, with
the focus on what happened and the message still there after a live refresh; the inbox at 390 px.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from runs.actors import Actor
from runs.models import Approval, ApprovalStatus
from tests.support import scenarios
from tests.support.axe import axe_violations, serve_axe
from tests.support.browser import COUNT_LIVE, held_payment, in_thread, login, wait_live

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT = 15_000  # ms


def _status(approval_id: str) -> tuple[str, str]:
    approval = Approval.objects.get(pk=int(approval_id.split("_", 1)[1]))
    return approval.status, approval.message


def _some_of_each(team, bob) -> None:
    scenarios.stopped_dirty(team, title="Dirty report", by=Actor.for_user(bob))
    run, _lease = scenarios.running(team, title="Deploy that lost its worker", write_open=True)
    scenarios.run_interrupt(run_id=run.pk)
    scenarios.handed_off(team, by=Actor.system("watchdog"), title="Handed report")


def test_needs_me_groups_by_kind_and_the_badge_agrees(
    page: Page, live_stack, team, bob, agent_api, screenshot_dir: Path
) -> None:
    in_thread(_some_of_each, team, bob)
    first, _run, _epoch = held_payment(agent_api)
    second, _run, _epoch = held_payment(agent_api)
    serve_axe(page, live_stack.url)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/needs-me/")
    wait_live(page)

    groups = page.locator(".needs-group")
    expect(groups).to_have_count(4)
    kinds = [groups.nth(i).get_attribute("data-kind") for i in range(4)]
    assert kinds == ["approval", "stopped_dirty", "interrupted", "handoff"]
    # approvals first, soonest deadline first (both have the same rule: the older asked first)
    rows = page.locator("#needs-group-approval li[data-approval-id]")
    assert [rows.nth(i).get_attribute("data-approval-id") for i in range(2)] == [first, second]
    expect(page.locator("#needs-legend")).to_be_visible()
    expect(page.locator("#nav-needs-count")).to_have_text(re.compile(r"^5"))
    expect(page.locator('[data-kind-count="approval"]')).to_have_text("2")
    page.screenshot(path=screenshot_dir / "needs-me-grouped.png", full_page=True, caret="initial")
    assert not axe_violations(page, live_stack.url)

    # The kind filter: only the dirty stops, and the address says so.
    page.locator('[data-kind-filter="stopped_dirty"]').click()
    expect(page).to_have_url(re.compile(r"kind=stopped_dirty"))
    expect(page.locator(".needs-group")).to_have_count(1)
    expect(page.locator(".needs-group")).to_have_attribute("data-kind", "stopped_dirty")

    # On a page without the list, the badge follows what waits all the same.
    page.goto(f"{live_stack.url}/")
    wait_live(page)
    held_payment(agent_api)
    expect(page.locator("#nav-needs-count")).to_have_text(re.compile(r"^6"), timeout=LIVE_TIMEOUT)
    expect(page.locator("#nav-approvals-count")).to_have_text(
        re.compile(r"^3"), timeout=LIVE_TIMEOUT
    )


def test_approve_as_it_is_from_the_inbox_by_keyboard(
    page: Page, live_stack, bob, agent_api, screenshot_dir: Path
) -> None:
    approval, run_id, epoch = held_payment(agent_api)
    other, _run, _epoch = held_payment(agent_api)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/approvals/")
    wait_live(page)
    page.evaluate(COUNT_LIVE)
    row = page.locator(f"#approval-row-{approval}")
    row.get_by_test_id("inline-approve-open").focus()
    page.keyboard.press("Enter")  # opens the confirmation
    confirm = row.get_by_test_id("inline-approve-confirm")
    expect(confirm).to_be_visible()
    page.keyboard.press("Tab")
    expect(confirm).to_be_focused()
    page.keyboard.press("Enter")

    note = page.locator(f"#decided-{approval}")
    expect(note).to_contain_text("Approved as it was", timeout=LIVE_TIMEOUT)
    expect(note).to_be_focused()  # not <body>: the keyboard user goes on from here
    assert in_thread(_status, approval) == (ApprovalStatus.APPROVED, "")
    page.screenshot(path=screenshot_dir / "inline-decision.png", full_page=True, caret="initial")

    # The list refreshes live (the decision and a new request are frames); the answer stays.
    before = page.evaluate("() => window.__liveSwaps")
    held_payment(agent_api)
    page.wait_for_function(f"() => window.__liveSwaps > {before}", timeout=LIVE_TIMEOUT)
    expect(page.locator(f"#approval-row-{approval}")).to_have_count(0)
    expect(page.locator(f"#approval-row-{other}")).to_be_visible()
    expect(note).to_be_visible()
    expect(note).to_contain_text("Approved as it was")


def test_reject_with_a_message_from_needs_me(page: Page, live_stack, bob, agent_api) -> None:
    approval, _run, _epoch = held_payment(agent_api)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/needs-me/")
    wait_live(page)
    item = page.locator(f"#needs-approval-{approval}")
    item.get_by_test_id("inline-reject-open").click()
    item.get_by_label("Message to the agent").fill("Refunds over 100 go through finance.")
    item.get_by_test_id("inline-reject-confirm").click()
    note = page.locator(f"#decided-{approval}")
    expect(note).to_contain_text("Rejected", timeout=LIVE_TIMEOUT)
    expect(note).to_be_focused()
    assert in_thread(_status, approval) == (
        ApprovalStatus.REJECTED,
        "Refunds over 100 go through finance.",
    )
    # Twice is refused as the approval page refuses it: said in place, nothing changes.
    page.goto(f"{live_stack.url}/approvals/?status=all")
    expect(page.locator(f"#approval-row-{approval}")).to_contain_text("rejected")


def test_focus_goes_to_the_outcome_after_a_keyboard_approve_on_the_approval_page(
    page: Page, live_stack, bob, agent_api
) -> None:
    approval, _run, _epoch = held_payment(agent_api)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/approvals/{approval}/")
    wait_live(page)
    page.get_by_test_id("approve-open").focus()
    page.keyboard.press("Enter")
    page.get_by_test_id("approve-confirm").focus()
    page.keyboard.press("Enter")
    note = page.locator("#approval-decided-note")
    expect(note).to_contain_text("Approved as it was", timeout=LIVE_TIMEOUT)
    expect(note).to_be_focused()
    assert page.evaluate("document.activeElement.tagName") != "BODY"


def test_the_inbox_and_needs_me_fit_390_px_and_show_the_time_left(
    browser, live_stack, bob, agent_api
) -> None:
    held_payment(agent_api)
    narrow = browser.new_context(viewport={"width": 390, "height": 844})
    small = narrow.new_page()
    try:
        login(small, live_stack.url, "bob")
        small.goto(f"{live_stack.url}/approvals/")
        overflow = small.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 1, overflow
        left = small.locator(".approvals-table td.cell-left").first
        expect(left).to_be_visible()
        box = left.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 391, box
        expect(small.get_by_test_id("inline-approve-open").first).to_be_visible()
        small.goto(f"{live_stack.url}/needs-me/")
        overflow = small.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 1, overflow
    finally:
        narrow.close()


def test_deciding_the_last_approval_keeps_its_answer_through_the_refresh_that_empties_the_group(
    page: Page, live_stack, bob, agent_api
) -> None:
    approval, run_id, epoch = held_payment(agent_api)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/needs-me/")
    wait_live(page)
    page.evaluate(COUNT_LIVE)
    item = page.locator(f"#needs-approval-{approval}")
    item.get_by_test_id("inline-reject-open").click()
    item.get_by_label("Message to the agent").fill("Not this week.")
    item.get_by_test_id("inline-reject-confirm").click()
    note = page.locator(f"#decided-{approval}")
    expect(note).to_contain_text("Rejected", timeout=LIVE_TIMEOUT)
    expect(page.locator("#nav-needs-count")).to_have_text(re.compile(r"^0"), timeout=LIVE_TIMEOUT)

    # Another refresh, and nothing of the kind waits any more: the approvals group is not
    # rendered at all. The answer stays, alone.
    before = page.evaluate("() => window.__liveSwaps")
    done = agent_api.post(
        f"/api/v1/runs/{run_id}/events/",
        json={"epoch": epoch, "events": [{"event_id": "done", "type": "run.completed"}]},
    )
    assert done.status_code in (200, 201, 202), done.text
    page.wait_for_function(f"() => window.__liveSwaps > {before}", timeout=LIVE_TIMEOUT)
    expect(note).to_be_visible()
    expect(note).to_contain_text("Rejected")
    expect(page.locator("#needs-group-approval [data-decide-row]")).to_have_count(0)
