"""Helpers of the browser tests (tests/browser/conftest.py has their fixtures)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from playwright.sync_api import Page, expect

T = TypeVar("T")


def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a service call off the Playwright loop's thread (it may publish with async_to_sync)."""
    from django.db import connections

    def call() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # the worker thread's own connection, or the test DB cannot be dropped

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


LIVE_TIMEOUT = 10_000  # ms: generous for a loaded CI box; a push normally lands in a few ms


def login(page: Page, url: str, username: str) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Sign in").click()
    # A reviewer with something waiting lands on /needs-me/, anyone else on the runs page.
    expect(page).to_have_url(re.compile(re.escape(url) + r"/(needs-me/)?$"))


def wait_live(page: Page) -> None:
    expect(page.locator("[data-live-indicator]").first).to_have_attribute(
        "data-state", "live", timeout=LIVE_TIMEOUT
    )


def mark_no_reload(page: Page) -> None:
    """A flag that a reload or navigation would wipe: proves the update came in place."""
    page.evaluate("window.__noReload = true")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__noReload === true"), "the page was reloaded"


def record_statuses(page: Page) -> None:
    """Record every status the run summary shows, in order, as it is swapped in."""
    page.evaluate("""() => {
        window.__seen = [];
        const record = () => {
            const el = document.querySelector('#run-summary');
            const status = el && el.dataset.status;
            if (status && window.__seen[window.__seen.length - 1] !== status) window.__seen.push(status);
        };
        record();
        new MutationObserver(record).observe(document.body, {subtree: true, childList: true, attributes: true});
    }""")


def create_run(api: httpx.Client, title: str) -> str:
    response = api.post(
        "/api/v1/runs/",
        json={
            "title": title,
            "agent": "report-bot",
            "steps": [{"key": "plan"}, {"key": "act"}, {"key": "notify"}],
        },
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


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


# Counts the live refreshes that have landed (the console marks them with X-Safestop-Live).
COUNT_LIVE = """() => {
  window.__liveSwaps = 0;
  document.addEventListener("htmx:afterSettle", (evt) => {
    const headers = (evt.detail.requestConfig && evt.detail.requestConfig.headers) || {};
    if (headers["X-Safestop-Live"]) window.__liveSwaps += 1;
  });
}"""

_calls = itertools.count(1)


def ask_approval(api: httpx.Client, run_id: str, epoch: int) -> str:
    """The agent asks to refund, and a reviewer must approve first: the approval's id."""
    response = api.post(
        f"/api/v1/runs/{run_id}/permits/",
        json={
            "epoch": epoch,
            "tool_call_id": f"refund_{next(_calls)}",
            "tool": "payments.refund",
            "side_effect": "write",
            "arguments": {"amount": 120, "order": "1042"},
            "needs_approval": True,
            "summary": "Refund order 1042 (charged twice)",
            "risk": "high",
        },
    )
    assert response.status_code == 202, response.text
    return response.json()["approval"]["id"]


def held_payment(api: httpx.Client) -> tuple[str, str, int]:
    """A new running run waiting for a refund's approval: the approval, the run, the epoch."""
    run_id = create_run(api, "Refund the duplicate charge")
    lease = api.post(f"/api/v1/runs/{run_id}/lease/", json={"worker_id": "w", "ttl_seconds": 60})
    assert lease.status_code in (200, 201), lease.text
    epoch = lease.json()["epoch"]
    return ask_approval(api, run_id, epoch), run_id, epoch
