"""An interrupted run with an unconfirmed write, from a reviewer's seat: the
run page says why Resume waits, the interruption packet resolves the write, and the open run
page offers Resume live, without a reload.

As in test_console.py, every change a browser must see live goes through the live server.
"""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import Page, expect

from runs.models import Run, RunStatus
from tests.support.browser import (
    assert_not_reloaded,
    collect_errors,
    create_run,
    login,
    mark_no_reload,
    wait_live,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIVE_TIMEOUT = 10_000


def _interrupted_with_a_write(agent_api) -> str:
    run_id = create_run(agent_api, "Deploy the hotfix")
    lease = agent_api.post(
        f"/api/v1/runs/{run_id}/lease/", json={"worker_id": "w-1", "ttl_seconds": 60}
    ).json()
    permit = agent_api.post(
        f"/api/v1/runs/{run_id}/permits/",
        json={
            "epoch": lease["epoch"],
            "tool_call_id": "deploy-1",
            "tool": "deploy.push",
            "side_effect": "write",
            "operation_id": "dep-77",
        },
    )
    assert permit.status_code in (200, 201), permit.text
    released = agent_api.post(
        f"/api/v1/runs/{run_id}/lease/release/",
        json={"lease_id": lease["lease_id"], "epoch": lease["epoch"]},
    )
    assert released.status_code == 200, released.text
    assert Run.objects.get(pk=run_id).status == RunStatus.INTERRUPTED
    return run_id


def test_an_interrupted_write_is_resolved_and_the_open_run_page_offers_resume(
    page: Page, live_stack, agent_api, bob
) -> None:
    run_id = _interrupted_with_a_write(agent_api)
    errors = collect_errors(page)
    login(page, live_stack.url, "bob")
    page.goto(f"{live_stack.url}/runs/{run_id}/")
    wait_live(page)
    expect(page.get_by_test_id("interruption-banner")).to_be_visible()
    expect(page.get_by_test_id("resume-disabled")).to_be_disabled()
    expect(page.locator("#resume-blocked")).to_contain_text("resolve the interruption's unknowns")
    mark_no_reload(page)

    packet = page.context.new_page()
    packet.goto(f"{live_stack.url}/runs/{run_id}/packet/")
    expect(packet.get_by_role("heading", name="Interruption packet")).to_be_visible()
    card = packet.locator('.unknown-card[data-target-id="deploy-1"]')
    card.locator('input[name="decision"][value="not_applied"]').check()
    card.get_by_label("Evidence").fill("dep-77 is not in the deploy history")
    card.get_by_role("button", name="Record resolution").click()
    expect(packet.get_by_text("That was the last unknown")).to_be_visible(timeout=LIVE_TIMEOUT)

    # The run page, open all along, enables Resume live: resolving changed no status.
    expect(page.get_by_test_id("resume-disabled")).to_have_count(0, timeout=LIVE_TIMEOUT)
    expect(page.get_by_test_id("interruption-banner")).to_have_count(0)
    assert_not_reloaded(page)
    page.locator("summary", has_text="Resume…").click()
    page.get_by_role("button", name="Confirm resume").click()
    deadline = time.monotonic() + LIVE_TIMEOUT / 1000
    while Run.objects.get(pk=run_id).status != RunStatus.PENDING:
        assert time.monotonic() < deadline, "the run did not resume"
        time.sleep(0.1)
    assert errors == []
