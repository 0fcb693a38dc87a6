"""Signing in through the organisation's IdP in a real browser, and being deprovisioned while
the console is open: Chromium signs in through a real OpenID provider (tests/support/oidc.py),
sees the teams its groups map to, and when the IdP deactivates the person through SCIM the
open page's socket closes (4401) and the page reloads onto the sign-in page."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from accounts.models import IdentityLink
from tests.support.livestack import LiveStack, start_live_stack
from tests.support.oidc import Provider, sso_settings, start_provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCIM_TOKEN = "browser-scim-token-0123456789"
LIVE_TIMEOUT = 10_000


@pytest.fixture
def idp_and_console(
    transactional_db: None, django_db_blocker: Any
) -> Iterator[tuple[Provider, LiveStack]]:
    with start_provider() as provider:
        overrides = sso_settings(provider, SAFESTOP_SCIM_TOKEN=SCIM_TOKEN)
        with start_live_stack(django_db_blocker, settings_overrides=overrides) as stack:
            yield provider, stack


def test_sign_in_through_the_idp_then_scim_deprovisioning_closes_the_open_console(
    page: Page, idp_and_console
):
    provider, stack = idp_and_console
    provider.set_user(
        "sub-bea",
        preferred_username="bea",
        groups=["safestop-reviewers", "globex-viewers", "unrelated"],
    )

    page.goto(f"{stack.url}/login/")
    page.get_by_role("link", name="Sign in with Example IdP").click()
    expect(page).to_have_url(re.compile(re.escape(provider.url) + r"/oauth2/authorize"))
    page.get_by_placeholder("sub").fill("sub-bea")
    page.get_by_role("button", name="Authorize").click()
    expect(page).to_have_url(re.compile(re.escape(stack.url) + r"/(home/|needs-me/)?$"))

    page.goto(f"{stack.url}/")
    expect(page.locator(".topbar__name")).to_have_text("bea")
    teams = page.locator("#f-team option").all_inner_texts()
    assert [team for team in teams if team in {"acme", "globex"}] == ["acme", "globex"]
    expect(page.locator("[data-live-indicator]").first).to_have_attribute(
        "data-state", "live", timeout=LIVE_TIMEOUT
    )

    user_id = IdentityLink.objects.get(subject="sub-bea").user_id
    answer = httpx.patch(
        f"{stack.url}/scim/v2/Users/{user_id}",
        headers={"Authorization": f"Bearer {SCIM_TOKEN}"},
        json={
            "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
            "Operations": [{"op": "replace", "value": {"active": False}}],
        },
        timeout=10,
    )
    assert answer.status_code == 200 and answer.json()["active"] is False

    # No click, no navigation by the test: the socket's close reloads the page.
    expect(page).to_have_url(re.compile(re.escape(stack.url) + r"/login/"), timeout=LIVE_TIMEOUT)
    expect(page.get_by_role("link", name="Sign in with Example IdP")).to_be_visible()
