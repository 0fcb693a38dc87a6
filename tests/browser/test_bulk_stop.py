"""Bulk stop in a real browser (DESIGN §12): tick rows, preview in a dialog (Escape closes it),
confirm, and the result page whose statuses settle live from the runs' own frames."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT = 10_000


def _login(page: Page, url: str, username: str) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(re.escape(url) + r"/(needs-me/)?$"))


def _running_run(api: httpx.Client, title: str) -> tuple[str, dict]:
    response = api.post("/api/v1/runs/", json={"title": title, "agent": "bulk-bot"})
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    lease = api.post(
        f"/api/v1/runs/{run_id}/lease/", json={"worker_id": "w", "ttl_seconds": 120}
    ).json()
    return run_id, lease


def test_tick_preview_confirm_and_watch_the_runs_settle(page: Page, live_stack, agent_api, bob):
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
    page.on(
        "console",
        lambda message: errors.append(message.text) if message.type == "error" else None,
    )
    (first, first_lease), (second, _), (third, _) = (
        _running_run(agent_api, f"Bulk {n}") for n in range(3)
    )
    _login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/?agent=bulk-bot")
    expect(page.locator("[data-live-indicator]").first).to_have_attribute(
        "data-state", "live", timeout=LIVE_TIMEOUT
    )
    page.locator(f'input[data-bulk-row][value="{first}"]').check()
    page.locator(f'input[data-bulk-row][value="{second}"]').check()
    expect(page.locator("[data-bulk-summary]")).to_have_text("2 selected.")

    page.get_by_test_id("bulk-stop-selected").click()
    dialog = page.locator("dialog[data-bulk-dialog]")
    expect(dialog).to_be_visible(timeout=LIVE_TIMEOUT)
    expect(dialog).to_contain_text("Stop 2 runs?")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    # The selection survived the dialog; open it again and confirm.
    expect(page.locator(f'input[data-bulk-row][value="{first}"]')).to_be_checked()
    page.get_by_test_id("bulk-stop-selected").click()
    expect(dialog).to_be_visible(timeout=LIVE_TIMEOUT)
    page.get_by_label("Note").fill("bulk-bot loops")
    page.get_by_test_id("bulk-confirm").click()

    expect(page).to_have_url(re.compile(r"/stops/bulk/bulk_[0-9a-f]+/$"), timeout=LIVE_TIMEOUT)
    rows = page.locator("#bulk-results tr[data-run-id]")
    expect(rows).to_have_count(2)
    expect(page.locator(f'#bulk-results tr[data-run-id="{first}"]')).to_have_attribute(
        "data-status", "cancel_requested"
    )
    expect(page.locator(f'#bulk-results tr[data-run-id="{third}"]')).to_have_count(0)
    expect(page.locator("[data-live-indicator]").first).to_have_attribute(
        "data-state", "live", timeout=LIVE_TIMEOUT
    )
    # The first run's worker drains: its row settles live, without a reload.
    page.evaluate("window.__noReload = true")
    drained = agent_api.post(
        f"/api/v1/runs/{first}/drained/",
        json={"lease_id": first_lease["lease_id"], "epoch": first_lease["epoch"]},
    )
    assert drained.status_code == 200, drained.text
    expect(page.locator(f'#bulk-results tr[data-run-id="{first}"]')).to_have_attribute(
        "data-status", "stopped_cleanly", timeout=LIVE_TIMEOUT
    )
    assert page.evaluate("window.__noReload === true")
    assert not errors, errors


def test_stop_all_matching_stops_what_was_previewed_and_says_requested_until_drained(
    page: Page, live_stack, agent_api, bob, screenshot_dir
):
    """The preview's runs and no others: a run that starts matching while the dialog is open
    is counted, not stopped; each row says "Stop requested" until its worker drains."""
    (first, first_lease), (second, _) = (_running_run(agent_api, f"Fleet {n}") for n in range(2))
    _login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/?agent=bulk-bot&status=running")
    matching = page.get_by_test_id("bulk-stop-matching")
    expect(matching).to_have_text("Stop all 2 matching…", timeout=LIVE_TIMEOUT)
    matching.click()
    dialog = page.locator("dialog[data-bulk-dialog]")
    expect(dialog).to_contain_text("Stop 2 runs?", timeout=LIVE_TIMEOUT)
    page.screenshot(path=str(screenshot_dir / "bulk-preview.png"))
    newcomer, _ = _running_run(agent_api, "Fleet late")  # begins to match after the preview
    page.get_by_test_id("bulk-confirm").click()

    expect(page).to_have_url(re.compile(r"/stops/bulk/bulk_[0-9a-f]+/$"), timeout=LIVE_TIMEOUT)
    expect(page.locator("#bulk-results tr[data-run-id]")).to_have_count(2)
    expect(page.locator(f'#bulk-results tr[data-run-id="{newcomer}"]')).to_have_count(0)
    expect(page.get_by_test_id("bulk-new-since-preview")).to_contain_text(
        "1 run began to match the filter after the preview"
    )
    first_row = page.locator(f'#bulk-results tr[data-run-id="{first}"]')
    expect(first_row).to_have_attribute("data-state", "requested")
    expect(first_row).to_contain_text("Stop requested")
    expect(page.locator("[data-live-indicator]").first).to_have_attribute(
        "data-state", "live", timeout=LIVE_TIMEOUT
    )
    drained = agent_api.post(
        f"/api/v1/runs/{first}/drained/",
        json={"lease_id": first_lease["lease_id"], "epoch": first_lease["epoch"]},
    )
    assert drained.status_code == 200, drained.text
    expect(first_row).to_have_attribute("data-state", "stopped_cleanly", timeout=LIVE_TIMEOUT)
    expect(first_row).to_contain_text("Stopped cleanly")
    expect(page.locator(f'#bulk-results tr[data-run-id="{second}"]')).to_have_attribute(
        "data-state", "requested"
    )
    page.screenshot(path=str(screenshot_dir / "bulk-result.png"), full_page=True)
    status = agent_api.get(f"/api/v1/runs/{newcomer}/").json()["status"]
    assert status == "running"
