"""The console in a real browser: login, live runs table, Stop seen live from a second browser,
resolving a stopped_dirty run from its stop packet, and a viewer's forged POST.

Every change that a browser must see *live* goes through the live server (the console itself or
the agent API), because the server's channel layer lives in its own process.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from handoff.models import Resolution
from runs.actors import Actor
from runs.models import OutboxItem, Run, RunStatus, StopRequest
from tests.support import scenarios
from tests.support.browser import (
    LIVE_TIMEOUT,
    assert_not_reloaded,
    collect_errors,
    create_run,
    in_thread,
    login,
    mark_no_reload,
    record_statuses,
    wait_live,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_reviewer_logs_in_and_a_new_run_appears_without_reload(
    page: Page, live_stack, agent_api, bob, screenshot_dir: Path
) -> None:
    errors = collect_errors(page)
    login(page, live_stack.url, "bob")
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.locator(".role-badge")).to_have_text("reviewer")
    wait_live(page)
    mark_no_reload(page)

    run_id = create_run(agent_api, "Arrived while you watched")
    row = page.locator(f'tr[data-run-id="{run_id}"]')
    expect(row).to_be_visible(timeout=LIVE_TIMEOUT)
    expect(row).to_contain_text("Arrived while you watched")
    expect(row.locator(".chip")).to_have_text("Pending")
    expect(page.locator(".state-pill--pending b")).to_have_text("1")

    lease = agent_api.post(
        f"/api/v1/runs/{run_id}/lease/", json={"worker_id": "worker-7", "ttl_seconds": 60}
    )
    assert lease.status_code in (200, 201), lease.text
    expect(row.locator(".chip")).to_have_text("Running", timeout=LIVE_TIMEOUT)
    assert_not_reloaded(page)
    page.screenshot(path=screenshot_dir / "runs.png", full_page=True, caret="initial")
    assert not errors, errors


def test_stop_in_one_browser_is_seen_live_in_another(
    browser: Browser, page: Page, live_stack, agent_api, bob, alice, screenshot_dir: Path
) -> None:
    run_id = create_run(agent_api, "Stop me, watched by two")
    lease = agent_api.post(
        f"/api/v1/runs/{run_id}/lease/", json={"worker_id": "worker-7", "ttl_seconds": 60}
    ).json()

    watcher_context = browser.new_context(viewport={"width": 1280, "height": 800})
    watcher = watcher_context.new_page()
    watcher_errors = collect_errors(watcher)
    try:
        login(watcher, live_stack.url, "alice")
        watcher.goto(f"{live_stack.url}/runs/{run_id}/")
        wait_live(watcher)
        expect(watcher.locator("#run-summary .chip")).to_have_text("Running")
        mark_no_reload(watcher)
        record_statuses(watcher)

        login(page, live_stack.url, "bob")
        page.goto(f"{live_stack.url}/runs/{run_id}/")
        wait_live(page)
        page.get_by_test_id("stop-open").click()
        page.get_by_label("Reason").select_option("user_stop")
        page.get_by_label("Note").first.fill("Numbers look wrong")
        page.get_by_test_id("stop-confirm").dblclick()  # a double click must stop once
        expect(page.locator("#run-actions")).to_contain_text(
            "Stop recorded (user stop)", timeout=LIVE_TIMEOUT
        )

        expect(watcher.locator("#run-summary .chip")).to_have_text(
            "Cancel requested", timeout=LIVE_TIMEOUT
        )
        expect(watcher.locator(".progression")).to_contain_text("waiting for the worker")
        expect(watcher.get_by_test_id("stop-open")).to_have_count(
            0
        )  # the actions followed the status
        watcher.screenshot(
            path=screenshot_dir / "run-cancel-requested.png", full_page=True, caret="initial"
        )

        # The worker notices on its heartbeat (the ack), then says it has drained.
        beat = agent_api.post(
            f"/api/v1/runs/{run_id}/lease/heartbeat/",
            json={"lease_id": lease["lease_id"], "epoch": lease["epoch"]},
        )
        assert beat.status_code == 200 and beat.json()["signal"]["reason"] == "user_stop", beat.text
        expect(watcher.locator("#run-summary .chip")).to_have_text("Draining", timeout=LIVE_TIMEOUT)
        drained = agent_api.post(
            f"/api/v1/runs/{run_id}/drained/",
            json={"lease_id": lease["lease_id"], "epoch": lease["epoch"], "observations": []},
        )
        assert drained.status_code == 200, drained.text
        expect(watcher.locator("#run-summary .chip")).to_have_text(
            "Stopped cleanly", timeout=LIVE_TIMEOUT
        )

        expect(watcher.locator("#run-actions")).to_have_attribute("data-status", "stopped_cleanly")
        seen = watcher.evaluate("window.__seen")
        assert seen[0] == "running" and seen[-1] == "stopped_cleanly", seen
        assert seen.index("cancel_requested") < seen.index("stopped_cleanly"), seen
        assert_not_reloaded(watcher)
        watcher.screenshot(path=screenshot_dir / "run-stopped.png", full_page=True, caret="initial")
        # the stopping browser followed too, and shows what can be done now
        expect(page.locator("#run-summary .chip")).to_have_text(
            "Stopped cleanly", timeout=LIVE_TIMEOUT
        )
        expect(page.locator("#run-actions")).to_contain_text("Resume")
        assert not watcher_errors, watcher_errors
    finally:
        watcher_context.close()

    assert StopRequest.objects.filter(run_id=run_id).count() == 1
    run = Run.objects.get(pk=run_id)
    assert (
        run.status == RunStatus.STOPPED_CLEANLY
        and run.stop_epoch == 2
        and run.stop_requested_by == "bob"
    )


def test_a_stopped_dirty_run_is_resolved_from_its_stop_packet(
    page: Page, live_stack, team, bob, screenshot_dir: Path
) -> None:
    run = in_thread(
        scenarios.stopped_dirty, team, by=Actor.for_user(bob), title="Deploy docs site (prod)"
    )
    call = run.execution_records.get(side_effect="write")
    errors = collect_errors(page)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/runs/{run.pk}/")
    expect(page.locator("#run-summary .chip")).to_have_text("Stopped dirty")
    expect(page.locator("#run-summary .needs-marker")).to_contain_text("needs resolution")
    page.get_by_test_id("resolve-link").click()
    expect(page).to_have_url(f"{live_stack.url}/runs/{run.pk}/packets/2/")
    wait_live(page)
    expect(page.locator("#packet-status")).to_contain_text("1 of 1 unknown still open")
    page.screenshot(path=screenshot_dir / "stop-packet.png", full_page=True, caret="initial")
    mark_no_reload(page)

    card = page.locator(f'.unknown-card[data-target-id="{call.tool_call_id}"]')
    card.get_by_label("Not applied").check()
    card.get_by_label("Evidence").fill("Deploy API lists no deployment for this operation id")
    card.get_by_role("button", name="Record resolution").click()

    expect(page.locator(f'.unknown-card[data-target-id="{call.tool_call_id}"]')).to_contain_text(
        "Resolved as not applied by bob", timeout=LIVE_TIMEOUT
    )
    expect(page.locator("#packet-status .chip")).to_have_text(
        "Stopped cleanly", timeout=LIVE_TIMEOUT
    )
    expect(page.locator("#packet-status")).to_contain_text("Every unknown is resolved")

    frozen = page.locator("#packet-frozen")
    frozen.get_by_role("button", name="Discard").click()
    expect(page.locator("#packet-frozen")).to_contain_text("discarded", timeout=LIVE_TIMEOUT)
    assert_not_reloaded(page)
    page.screenshot(
        path=screenshot_dir / "stop-packet-resolved.png", full_page=True, caret="initial"
    )
    assert not errors, errors

    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED_CLEANLY
    assert Resolution.objects.get(run=run).evidence.startswith("Deploy API lists")
    assert OutboxItem.objects.get(run=run).status == "discarded"


def test_a_viewer_sees_no_stop_button_and_a_forged_post_is_403(
    page: Page, live_stack, agent_api, charlie
) -> None:
    run_id = create_run(agent_api, "Only watch this one")
    agent_api.post(
        f"/api/v1/runs/{run_id}/lease/", json={"worker_id": "worker-7", "ttl_seconds": 60}
    )
    login(page, live_stack.url, "charlie")
    expect(page.locator(".role-badge")).to_have_text("viewer")
    page.goto(f"{live_stack.url}/runs/{run_id}/")
    expect(page.locator("#run-summary .chip")).to_have_text("Running")
    expect(page.get_by_test_id("stop-open")).to_have_count(0)
    expect(page.get_by_test_id("takeover-open")).to_have_count(0)
    expect(page.locator("#run-actions")).to_contain_text("need the reviewer role")

    # A forged POST from the viewer's own session, with a valid CSRF token: refused by role.
    status = page.evaluate(
        """async (runId) => {
        const token = JSON.parse(document.body.getAttribute('hx-headers'))['X-CSRFToken'];
        const response = await fetch(`/runs/${runId}/stop/`, {
            method: 'POST', headers: {'X-CSRFToken': token, 'Content-Type': 'application/x-www-form-urlencoded'},
            body: 'reason=user_stop&note=forged'});
        return response.status;
    }""",
        run_id,
    )
    assert status == 403
    assert Run.objects.get(pk=run_id).status == RunStatus.RUNNING
    assert not StopRequest.objects.filter(run_id=run_id).exists()


def _seed_everything(team: Any, bob: Any, alice: Any) -> dict[str, Run]:
    reviewer = Actor.for_user(bob)
    runs: dict[str, Run] = {}
    for index in range(6):
        runs["running"], _lease = scenarios.running(
            team, title=f"Refresh CRM contacts #{index}", agent="crm-sync"
        )
    runs["dirty"] = scenarios.stopped_dirty(
        team, by=reviewer, title="Deploy docs site (prod)", agent="deployer"
    )
    runs["clean"] = scenarios.stopped_cleanly(
        team, by=reviewer, title="Reconcile invoices", agent="report-bot"
    )
    runs["handed_off"] = scenarios.handed_off(
        team, by=reviewer, title="Rotate API keys", agent="crm-sync"
    )
    scenarios.handed_off(
        team, by=Actor.for_user(alice), title="Summarise incident 4411", agent="triage-bot"
    )
    runs["completed"] = scenarios.completed(team, title="Nightly digest", agent="report-bot")
    runs["failed"] = scenarios.failed(team, title="Scrape vendor portal", agent="crm-sync")
    runs["pending"] = scenarios.new_run(team, title="Waiting for a worker")
    return runs


def test_main_pages_render_cleanly_and_are_saved_as_screenshots(
    browser: Browser, page: Page, live_stack, team, bob, alice, agent_token, screenshot_dir: Path
) -> None:
    runs = in_thread(_seed_everything, team, bob, alice)
    errors = collect_errors(page)
    login(page, live_stack.url, "alice")
    pages = {
        "runs-admin": "/",
        "run-running": f"/runs/{runs['running'].pk}/",
        "run-dirty": f"/runs/{runs['dirty'].pk}/",
        "run-handed-off": f"/runs/{runs['handed_off'].pk}/",
        "stop-packet-dirty": f"/runs/{runs['dirty'].pk}/packets/2/",
        "handoffs": "/handoffs/",
        "audit": "/audit/",
        "quality": "/quality/",
        "tokens": "/tokens/",
    }
    for name, path in pages.items():
        response = page.goto(f"{live_stack.url}{path}")
        assert response is not None and response.status == 200, (name, response and response.status)
        if name == "audit":
            # No walk recorded yet: "Verify now" queues one, which the server runs in the
            # background; the line polls until the outcome is recorded.
            expect(page.locator("#ledger-verify")).to_contain_text("Ledger not verified yet")
            page.get_by_test_id("ledger-verify-now").click()
            expect(page.locator("#ledger-verify")).to_contain_text(
                "every hash chain intact", timeout=LIVE_TIMEOUT
            )
            expect(page.locator("#ledger-verify")).to_contain_text("asked by alice")
        if name.startswith("run") or name in ("handoffs", "stop-packet-dirty"):
            wait_live(page)
        page.screenshot(path=screenshot_dir / f"{name}.png", full_page=True, caret="initial")

    # Keyboard: the first Tab reaches the skip link, and it moves focus to the content.
    page.goto(f"{live_stack.url}/runs/{runs['running'].pk}/")
    page.keyboard.press("Tab")
    expect(page.locator(".skip-link")).to_be_focused()
    page.get_by_test_id("stop-open").focus()
    page.keyboard.press("Enter")  # opens the Stop panel from the keyboard
    expect(page.get_by_test_id("stop-confirm")).to_be_visible()

    narrow = browser.new_context(viewport={"width": 390, "height": 844})
    small = narrow.new_page()
    try:
        login(small, live_stack.url, "alice")
        small.screenshot(path=screenshot_dir / "runs-narrow.png", full_page=True, caret="initial")
        small.goto(f"{live_stack.url}/runs/{runs['dirty'].pk}/")
        # usable narrow: nothing wider than the screen except inside the scrolling table wrappers
        overflow = small.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 1, overflow
        small.screenshot(path=screenshot_dir / "run-narrow.png", full_page=True, caret="initial")
    finally:
        narrow.close()
    assert not errors, errors


def test_signing_out_in_another_tab_takes_the_live_page_back_to_the_login(
    page: Page, live_stack, bob
) -> None:
    """The session ended elsewhere: the server closes the open socket with 4401 and the page
    reloads itself onto the login form instead of streaming to a signed-out browser."""
    login(page, live_stack.url, "bob")
    wait_live(page)
    other_tab = page.context.new_page()
    other_tab.goto(f"{live_stack.url}/")
    other_tab.get_by_role("button", name="Sign out").click()
    expect(other_tab).to_have_url(re.compile(r"/login/"), timeout=LIVE_TIMEOUT)
    expect(page).to_have_url(re.compile(r"/login/"), timeout=LIVE_TIMEOUT)
    expect(page.get_by_label("Username")).to_be_visible()
