"""axe-core in a real browser: the serious and critical accessibility violations of a page.

axe-core comes from `tests/browser/node_modules` (`make axe`: `npm ci` from the committed
package-lock.json) and is served to the page by Playwright on the page's own origin, so the
Content-Security-Policy (script-src 'self') lets it run — never from a CDN.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

AXE = Path(__file__).resolve().parents[1] / "browser" / "node_modules" / "axe-core" / "axe.min.js"
AXE_PATH = "/__test__/axe.min.js"  # answered by Playwright, never by the server
BLOCKING = ("serious", "critical")


def axe_source() -> str:
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `make axe` (npm ci in tests/browser; make test does)")
    return AXE.read_text()


def serve_axe(page: Page, base_url: str) -> None:
    source = axe_source()
    page.route(
        f"{base_url}{AXE_PATH}",
        lambda route: route.fulfill(status=200, content_type="application/javascript", body=source),
    )


def axe_violations(page: Page, base_url: str) -> list[dict[str, Any]]:
    """Run axe on the page as it is now; the serious and critical violations."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(url=f"{base_url}{AXE_PATH}")
    result = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
    )
    return [
        {
            "id": violation["id"],
            "impact": violation["impact"],
            "help": violation["help"],
            "nodes": [node["target"] for node in violation["nodes"]][:5],
        }
        for violation in result
        if violation["impact"] in BLOCKING
    ]
