"""Live refreshes leave the person's place alone: a keyboard user tabs into the rows of the runs
page and of the approvals inbox while runs change every second, and the focus stays on the link
it reached through several refreshes; a decision's message is still shown after the run's
frames have refreshed the approval page for five seconds.

Changes come from another thread through the agent's API, as the simulator's do: the live
server's channel layer is its own, so only a change made through it reaches the browser.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support.browser import (
    COUNT_LIVE,
    ask_approval,
    collect_errors,
    create_run,
    held_payment,
    login,
    wait_live,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT = 15_000  # ms


def every_second(change: Callable[[], object], stop: threading.Event) -> threading.Thread:
    """Make one change a second until `stop`, from a thread of its own."""

    def loop() -> None:
        while not stop.wait(1.0):
            change()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def agent(url: str, headers: httpx.Headers) -> httpx.Client:
    """A client of the agent's own, for a thread (one client is not shared between threads)."""
    return httpx.Client(base_url=url, headers=dict(headers), timeout=10)


def tab_into(page: Page, selector: str, limit: int = 150) -> None:
    """Press Tab until a link matching `selector` has the focus, then remember that element
    (the element itself, and its address: a refresh must not turn it into another row's link)."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate(
            "(s) => { const a = document.activeElement; return !!a && a.matches(s); }", selector
        ):
            page.evaluate(
                "() => { window.__reached = document.activeElement;"
                " window.__reachedHref = document.activeElement.getAttribute('href'); }"
            )
            return
    pytest.fail(f"{limit} Tabs never reached {selector}")


def assert_focus_stays(page: Page, refreshes: int) -> None:
    start_count = page.evaluate("() => window.__liveSwaps")
    page.wait_for_function(
        f"() => window.__liveSwaps >= {start_count + refreshes}", timeout=LIVE_TIMEOUT
    )
    state = page.evaluate(
        "() => { const a = document.activeElement;"
        " return {same: a === window.__reached, connected: !!a && a.isConnected,"
        " href: a && a.getAttribute('href') === window.__reachedHref, tag: a && a.tagName}; }"
    )
    assert state == {"same": True, "connected": True, "href": True, "tag": "A"}, state


def tab_in_while_changing(
    page: Page, base_url: str, path: str, change: Callable[[], object], selector: str
) -> None:
    """Open `path` as bob, make `change` once a second, Tab to `selector`: the focus stays on
    the element it reached through four live refreshes, and the page logs no error."""
    errors = collect_errors(page)
    login(page, base_url, "bob")
    page.goto(f"{base_url}{path}")
    wait_live(page)
    page.evaluate(COUNT_LIVE)
    stop = threading.Event()
    churn = every_second(change, stop)
    try:
        page.wait_for_function("() => window.__liveSwaps >= 1", timeout=LIVE_TIMEOUT)
        tab_into(page, selector)
        assert_focus_stays(page, refreshes=4)
    finally:
        stop.set()
        churn.join(timeout=10)
    assert not errors, errors


def test_tabbing_reaches_the_runs_rows_and_stays_while_runs_change(
    page: Page, live_stack, agent_api, bob
) -> None:
    for index in range(3):
        create_run(agent_api, f"steady {index}")
    counter = itertools.count()

    def change() -> None:
        with agent(live_stack.url, agent_api.headers) as api:
            made = create_run(api, f"arriving {next(counter)}")
            api.post(f"/api/v1/runs/{made}/lease/", json={"worker_id": "w", "ttl_seconds": 60})

    tab_in_while_changing(
        page, live_stack.url, "/", change, "#runs-region tr[data-run-id] a.run-title"
    )


def test_tabbing_reaches_the_approvals_rows_and_stays_while_approvals_change(
    page: Page, live_stack, agent_api, bob
) -> None:
    for _ in range(2):
        held_payment(agent_api)

    def change() -> None:
        with agent(live_stack.url, agent_api.headers) as api:
            held_payment(api)

    tab_in_while_changing(
        page,
        live_stack.url,
        "/approvals/",
        change,
        "#approvals-region tr[data-approval-id] a.run-title",
    )


def test_a_decisions_message_is_still_shown_five_seconds_later(
    page: Page, live_stack, agent_api, bob
) -> None:
    approval, run_id, epoch = held_payment(agent_api)
    errors = collect_errors(page)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/approvals/{approval}/")
    wait_live(page)
    page.evaluate(COUNT_LIVE)
    page.get_by_test_id("approve-open").click()
    page.get_by_test_id("approve-confirm").click()
    message = page.locator("#approval-decision [data-flash]")
    expect(message).to_contain_text("Approved as it was", timeout=LIVE_TIMEOUT)
    shown_at = time.monotonic()
    stop = threading.Event()

    # The run goes on asking: each request is a frame for this run, and each refreshes the
    # approval's status, which brings the (decided) outcome panel along out of band.
    def change() -> None:
        with agent(live_stack.url, agent_api.headers) as api:
            ask_approval(api, run_id, epoch)

    churn = every_second(change, stop)
    try:
        page.wait_for_function("() => window.__liveSwaps >= 5", timeout=LIVE_TIMEOUT)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - shown_at)))
        expect(message).to_be_visible()
        expect(message).to_contain_text("Approved as it was")
    finally:
        stop.set()
        churn.join(timeout=10)
    assert not errors, errors
