"""The console on a 390 px phone: the run page of a run with ~40 tool calls stays compact (tool
calls as cards, not a 9-column table squeezed into 390 px) and nothing overflows sideways."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from tests.support import scenarios
from tests.support.browser import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}
# The page of a 40-call run measured 10,000 px on a phone before the compact layout; each call
# is now a card of a few lines, so the whole page fits in a few screens' worth of scrolling.
MAX_RUN_PAGE_HEIGHT = 6_500

OVERFLOW = """() => {
    const width = document.documentElement.clientWidth;
    const wide = [];
    for (const el of document.querySelectorAll('body *')) {
        // Inside a horizontal scroller (a wide ledger table) is fine: the page itself does not move.
        if (el.closest('.table-wrap') && el.closest('.table-wrap') !== el) continue;
        const box = el.getBoundingClientRect();
        if (box.width && box.right > width + 1) wide.push(el.tagName + '.' + el.className + ' ' + Math.round(box.right));
    }
    return {scrollWidth: document.documentElement.scrollWidth, width, wide: wide.slice(0, 10)};
}"""


def test_the_run_page_is_compact_on_a_phone(
    browser: Browser, live_stack, team, bob, screenshot_dir: Path
) -> None:
    run, _lease = in_thread(
        scenarios.running, team, title="Forty tool calls on a phone", calls_per_step=20
    )
    assert run.tool_calls_count == 40
    context = browser.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    page = context.new_page()
    try:
        page.goto(f"{live_stack.url}/login/")
        page.get_by_label("Username").fill("bob")
        page.get_by_label("Password").fill("pw-bob")
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(re.compile(re.escape(live_stack.url) + r"/(needs-me/)?$"))
        page.goto(f"{live_stack.url}/runs/{run.pk}/")
        expect(page.locator("#tool-calls .call-card").first).to_be_visible()
        height = page.evaluate("document.documentElement.scrollHeight")
        page.screenshot(path=screenshot_dir / "run-390.png", full_page=True, caret="initial")
        sections = page.evaluate(
            "() => Object.fromEntries([...document.querySelectorAll('main section[id], main div[id]')]"
            ".map(el => [el.id, Math.round(el.getBoundingClientRect().height)]))"
        )
        assert height <= MAX_RUN_PAGE_HEIGHT, f"{height} px: {sections}"
        overflow = page.evaluate(OVERFLOW)
        assert overflow["scrollWidth"] <= overflow["width"], overflow
        assert not overflow["wide"], overflow
        # Each call still says what a reviewer needs: its id, tool, step and how it went.
        first = page.locator("#tool-calls tbody tr").first
        expect(first).to_contain_text("web.search")
        expect(first.locator('td[data-label="Execution"]')).to_contain_text("succeeded")
        expect(first.locator('td[data-label="Step"]')).to_be_visible()
        # The ledger shows its latest 20 entries on a phone, and all of them on request.
        ledger = page.locator("#ledger tbody tr")
        assert ledger.count() > 20
        expect(ledger.nth(20)).to_be_hidden()
        page.get_by_role("link", name=re.compile(r"Show all \d+ entries")).click()
        expect(ledger.nth(20)).to_be_visible()
    finally:
        context.close()
