"""Browser tests: Playwright (sync) driving Debian's Chromium against a live daphne server.

- The server is the shared `live_stack` fixture (tests/support/livestack.py): daphne in a forked
  process on the test database, speaking HTTP and websockets. Its channel layer lives in the server, so
  a change must be made *through the server* (the console or the API) to reach a browser live.
- Playwright's sync API runs an event loop in the test's thread: ORM calls there need
  DJANGO_ALLOW_ASYNC_UNSAFE (set here, for tests only), and service calls that publish on commit
  run in a worker thread (`in_thread`), never under the loop (SETUP pitfalls 1 and 2).
- Browser tests sort last, so no async test runs after a Playwright loop (SETUP pitfall 3).
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import httpx  # noqa: E402
import pytest  # noqa: E402

SCREENSHOTS = Path(__file__).parent / "screenshots"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: run `bash scripts/ensure-chromium.sh` (make test does)"
        )
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": [
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ],
    }


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_context_args, "viewport": {"width": 1280, "height": 800}}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Browser tests last: after Playwright's loop has run, async tests cannot start their own."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


@pytest.fixture
def screenshot_dir() -> Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    return SCREENSHOTS


@pytest.fixture
def agent_api(live_stack, agent_token) -> Iterator[httpx.Client]:
    """The agent's side of the wire contract, against the live server."""
    with httpx.Client(
        base_url=live_stack.url, headers={"Authorization": f"Bearer {agent_token.raw}"}, timeout=10
    ) as client:
        yield client
