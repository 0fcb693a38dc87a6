"""What the live-socket tests share: in-process sockets on a fresh in-memory layer (a module asks
for it with `pytest.mark.usefixtures("fresh_channel_layer")`); the re-check timer fixtures
(`no_timer`, `fast_timer`) are in tests/console/conftest.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator

ORIGIN = "http://127.0.0.1:8000"


@pytest.fixture
def fresh_channel_layer() -> Iterator[None]:
    """An in-memory layer per test: its queues belong to the test's own event loop."""
    channel_layers.backends = {}
    yield
    channel_layers.backends = {}


async def close_code(
    communicator: WebsocketCommunicator, timeout: float = 3
) -> tuple[int, list[Any]]:
    """Wait for the server to close the socket: its close code, and any frames sent before."""
    frames: list[Any] = []
    while True:
        output = await communicator.receive_output(timeout=timeout)
        if output["type"] == "websocket.close":
            return output.get("code"), frames
        frames.append(json.loads(output["text"]))
