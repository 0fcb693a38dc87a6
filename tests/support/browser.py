"""Helpers of the browser tests (tests/browser/conftest.py has their fixtures)."""

from __future__ import annotations

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
