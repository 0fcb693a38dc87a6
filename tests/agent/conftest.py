"""Fixtures for the agent package's own tests: no Django, no database, no live server."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from agent_fakes import FakeApi

from safestop_agent import SafestopClient


@pytest.fixture
def fake_api() -> FakeApi:
    return FakeApi()


@pytest.fixture
def client(fake_api: FakeApi) -> Iterator[SafestopClient]:
    # Port 9 (discard) so a stray websocket push attempt fails fast and harmlessly.
    api = SafestopClient(
        "http://127.0.0.1:9", "secret-token", transport=httpx.MockTransport(fake_api.handle)
    )
    yield api
    api.disconnect()
