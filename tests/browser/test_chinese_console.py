"""A reviewer whose browser asks for Chinese: sign-in → Needs me → approve → Stop, all in
Simplified Chinese, with axe-core at zero serious or critical violations on every page on the
way, and screenshots of the runs page, a stop packet and an approval (tests/browser/screenshots/).
Then the header's switch: the reviewer's own choice (English) wins over the browser's header."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from accounts.models import UserSettings
from handoff.models import StopPacket
from runs.actors import Actor
from runs.models import Approval, Run, Team
from tests.support import approvals, scenarios
from tests.support.axe import axe_violations, serve_axe
from tests.support.browser import in_thread

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _world(team: Team, bob: Any) -> tuple[Approval, Run, int]:
    team.time_zone = "Asia/Shanghai"
    team.save(update_fields=["time_zone"])
    approval = approvals.waiting(
        team, summary="退款订单 1042", title="客户退款", agent="billing-bot"
    )
    dirty = scenarios.stopped_dirty(team, title="季度报告", by=Actor.for_user(bob))
    epoch = StopPacket.objects.filter(run=dirty).values_list("stop_epoch", flat=True).get()
    return approval, dirty, epoch


@pytest.fixture
def chinese_page(browser: Browser, browser_context_args: dict[str, Any]) -> Any:
    context = browser.new_context(**browser_context_args, locale="zh-CN")
    yield context.new_page()
    context.close()


def _checked(page: Page, url: str, name: str, found: dict[str, Any]) -> None:
    expect(page.locator("html")).to_have_attribute("lang", "zh-Hans")
    if violations := axe_violations(page, url):
        found[name] = violations


def test_a_reviewer_signs_in_approves_and_stops_in_chinese(
    chinese_page: Page, live_stack: Any, team: Team, bob: Any, screenshot_dir: Path
) -> None:
    page = chinese_page
    url = live_stack.url
    approval, dirty, epoch = in_thread(_world, team, bob)
    serve_axe(page, url)
    found: dict[str, Any] = {}

    page.goto(f"{url}/login/")
    _checked(page, url, "sign-in", found)
    page.get_by_label("用户名").fill("bob")
    page.get_by_label("密码").fill("pw-bob")
    page.get_by_role("button", name="登录").click()

    expect(page).to_have_url(f"{url}/needs-me/")
    expect(page.get_by_role("heading", level=1)).to_have_text("待我处理")
    _checked(page, url, "needs me", found)

    page.locator(f'a[href="/approvals/{approval.public_id}/"]').first.click()
    expect(page).to_have_url(re.compile(re.escape(f"/approvals/{approval.public_id}/")))
    expect(page.locator("time[data-countdown]").first).to_contain_text("还剩")
    _checked(page, url, "approval", found)
    page.screenshot(path=str(screenshot_dir / "zh-hans-approval.png"), full_page=True)
    page.get_by_test_id("approve-open").click()
    page.get_by_test_id("approve-confirm").click()
    expect(page.get_by_test_id("approval-status")).to_have_text("已批准")
    _checked(page, url, "approval decided", found)

    page.goto(f"{url}/")
    expect(page.get_by_role("heading", level=1)).to_have_text("运行")
    _checked(page, url, "runs", found)
    page.screenshot(path=str(screenshot_dir / "zh-hans-runs.png"), full_page=True)

    page.goto(f"{url}/runs/{approval.run_id}/")
    page.get_by_test_id("stop-open").click()
    page.get_by_test_id("stop-confirm").click()
    chip = page.locator("#run-status .chip")
    expect(chip).not_to_have_text("运行中")
    expect(chip).to_have_text(re.compile("已请求取消|排空中|已干净停止|未干净停止"))
    _checked(page, url, "run after stop", found)

    page.goto(f"{url}/runs/{dirty.pk}/packets/{epoch}/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("停止报告")
    _checked(page, url, "stop packet", found)
    page.screenshot(path=str(screenshot_dir / "zh-hans-stop-packet.png"), full_page=True)

    # the rest of a reviewer's nav, each page in Chinese
    for name, path, heading in (
        ("approvals", "/approvals/", "审批"),
        ("handoffs", "/handoffs/", "交接"),
        ("quality", "/quality/", "停止质量"),
    ):
        page.goto(f"{url}{path}")
        expect(page.get_by_role("heading", level=1)).to_contain_text(heading)
        _checked(page, url, name, found)

    assert not found, json.dumps(found, indent=1, ensure_ascii=False)

    # The reviewer's own choice wins over the browser's Accept-Language, and is kept on the user.
    page.get_by_label("语言").select_option("en")
    page.get_by_role("button", name="切换").click()
    expect(page.locator("html")).to_have_attribute("lang", "en")
    expect(
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs")
    ).to_be_visible()
    chosen = in_thread(lambda: UserSettings.objects.get(user=bob).language)
    assert chosen == "en"
