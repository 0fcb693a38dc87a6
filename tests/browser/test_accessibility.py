"""Accessibility in a real browser: axe-core on every console page (no serious or critical
violation), the focus after Stop, Escape on a confirmation, and the fields' focus ring.

axe-core comes from `tests/browser/node_modules` (`make axe`: `npm ci` from the committed
package-lock.json) and is served to the page by Playwright on the page's own origin, so the
Content-Security-Policy (script-src 'self') lets it run — never from a CDN.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from gateway.services import upstream_create
from handoff.models import StopPacket
from notifications.services import channel_create
from runs import services
from runs.actors import Actor
from runs.models import Approval, Run, RunStatus, Team
from tests.support import scenarios
from tests.support.axe import axe_violations, serve_axe
from tests.support.browser import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def login(page: Page, url: str, username: str) -> None:
    page.goto(f"{url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(re.escape(url) + r"/(needs-me/)?$"))


def _waiting_approval(team: Team) -> Approval:
    run = scenarios.new_run(team, title="Customer refunds", agent="billing-bot")
    lease = scenarios.start(run)
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="a11y_refund_1",
        tool="payments.refund",
        actor=scenarios.AGENT,
        side_effect="write",
        arguments={"amount": 120, "order": "1042"},
        needs_approval=True,
        summary="Refund order 1042",
        risk="high",
    )
    return Approval.objects.get(execution_record=record)


def _interrupted(team: Team) -> Run:
    run, _lease = scenarios.running(team, title="Deploy that lost its worker", write_open=True)
    run = scenarios.run_interrupt(run_id=run.pk)
    assert run.status == RunStatus.INTERRUPTED
    return run


def every_page(team: Team, bob: Any, alice: Any) -> dict[str, str]:
    """Runs in every state a reviewer meets, and the path of every console page."""
    running, _lease = scenarios.running(team, title="Busy report")
    dirty = scenarios.stopped_dirty(team, title="Dirty report", by=Actor.for_user(bob))
    interrupted = _interrupted(team)
    scenarios.handed_off(team, by=Actor.for_user(bob), title="Handed report")
    approval = _waiting_approval(team)
    rule = services.approval_rule_create(
        team_id=team.pk, actor=Actor.for_user(alice), name="refunds", tool_glob="payments.*"
    )
    channel = channel_create(
        team=team,
        name="on-call mail",
        kind="email",
        target="oncall@example.com",
        actor=Actor.for_user(alice),
    ).channel
    upstream = upstream_create(
        team=team,
        name="everything",
        transport="stdio",
        command="npx",
        args=["@modelcontextprotocol/server-everything", "stdio"],
        env={"API_KEY": "never-shown"},
        actor=Actor.for_user(alice),
    )
    epoch = StopPacket.objects.filter(run=dirty).values_list("stop_epoch", flat=True).first()
    return {
        "runs": "/",
        "needs me": "/needs-me/",
        "needs me (approvals only)": "/needs-me/?kind=approval",
        "run (running)": f"/runs/{running.pk}/",
        "run (stopped dirty)": f"/runs/{dirty.pk}/",
        "stop packet": f"/runs/{dirty.pk}/packets/{epoch}/",
        "run (interrupted)": f"/runs/{interrupted.pk}/",
        "interruption packet": f"/runs/{interrupted.pk}/packet/",
        "approvals": "/approvals/",
        "approval": f"/approvals/{approval.public_id}/",
        "approval rules": "/approvals/rules/",
        "approval rule": f"/approvals/rules/{rule.pk}/",
        "handoffs": "/handoffs/",
        "audit": "/audit/",
        "stop quality": "/quality/",
        "tokens": "/tokens/",
        "mcp upstreams": "/upstreams/",
        "mcp upstream": f"/upstreams/{upstream.pk}/",
        "notification channels": "/notifications/",
        "notification channel": f"/notifications/channels/{channel.pk}/",
        "notification deliveries": "/notifications/deliveries/",
        "notification outbox": "/notifications/outbox/",
        "notification subscriptions": "/notifications/subscriptions/",
    }


def test_every_console_page_has_no_serious_accessibility_violation(
    page: Page, live_stack, team, alice, bob, screenshot_dir: Path
) -> None:
    pages = in_thread(every_page, team, bob, alice)
    serve_axe(page, live_stack.url)

    page.goto(f"{live_stack.url}/login/")
    found: dict[str, Any] = {}
    if violations := axe_violations(page, live_stack.url):
        found["login"] = violations
    login(page, live_stack.url, "alice")  # an admin of the team: every page and every control
    for name, path in pages.items():
        response = page.goto(f"{live_stack.url}{path}")
        assert response is not None and response.status == 200, f"{name}: {path}"
        if violations := axe_violations(page, live_stack.url):
            found[name] = violations
    assert not found, json.dumps(found, indent=1)


def test_focus_moves_to_the_new_status_after_stop(page: Page, live_stack, team, bob) -> None:
    run, _lease = in_thread(scenarios.running, team, title="Stop me by keyboard")
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/runs/{run.pk}/")
    page.get_by_test_id("stop-open").click()
    page.get_by_test_id("stop-confirm").click()
    status = page.locator("#run-status")
    expect(status.locator(".chip")).not_to_have_text("Running")
    expect(status).to_be_focused()
    assert page.evaluate("document.activeElement.id") == "run-status"


def test_escape_closes_the_stop_confirmation(page: Page, live_stack, team, bob) -> None:
    run, _lease = in_thread(scenarios.running, team, title="Changed my mind")
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/runs/{run.pk}/")
    opener = page.get_by_test_id("stop-open")
    opener.click()
    page.locator("#stop-note").focus()
    expect(page.get_by_test_id("stop-confirm")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.get_by_test_id("stop-confirm")).to_be_hidden()
    expect(opener).to_be_focused()
    assert in_thread(lambda: Run.objects.get(pk=run.pk).status) == RunStatus.RUNNING


def _luminance(rgb: tuple[float, float, float]) -> float:
    def channel(value: float) -> float:
        value /= 255
        return value / 12.92 if value <= 0.03928 else ((value + 0.055) / 1.055) ** 2.4

    red, green, blue = (channel(value) for value in rgb)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def _contrast(one: tuple[float, float, float], two: tuple[float, float, float]) -> float:
    lighter, darker = sorted((_luminance(one), _luminance(two)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def test_the_focus_ring_of_fields_meets_wcag_contrast(page: Page, live_stack, team, bob) -> None:
    """WCAG 2.2 AA (1.4.11): a focus indicator needs 3:1 against what is next to it."""
    run, _lease = in_thread(scenarios.running, team, title="Focus ring")
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/runs/{run.pk}/")
    page.get_by_test_id("stop-open").click()
    for selector in ("#stop-reason", "#stop-note"):
        page.locator(selector).focus()
        ring = page.evaluate(
            """(selector) => {
                const style = getComputedStyle(document.querySelector(selector));
                return {color: style.outlineColor, width: style.outlineWidth, style: style.outlineStyle};
            }""",
            selector,
        )
        parts = [float(part) for part in re.findall(r"[\d.]+", ring["color"])]
        alpha = parts[3] if len(parts) > 3 else 1.0
        assert ring["style"] == "solid" and float(ring["width"].rstrip("px")) >= 2, ring
        assert alpha == 1.0, ring  # a translucent ring's contrast depends on what is under it
        assert _contrast((parts[0], parts[1], parts[2]), (255, 255, 255)) >= 3, ring
