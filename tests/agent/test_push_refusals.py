"""The agent's push socket takes no for an answer (docs/api.md, "Push socket").

4401 (token refused) and 4404 (no such run) will not change by reconnecting; each new attempt
with a wrong token spends the address's wrong-token budget, and once it is spent the server
closes every handshake from that address with 4429 — the other workers' on the same host too.
So the listener stops reconnecting after 4401/4404 (the heartbeat still carries stops), and
after 4429 waits the throttle window out instead of its usual backoff. A real websocket server
(websockets' own) closes each handshake with the code under test and counts them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from websockets.sync.server import serve

from safestop_agent.signals import PushListener


class ClosingServer:
    """Accepts every handshake and closes it at once with `code`."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.handshakes = 0
        self._server = serve(self._handle, "127.0.0.1", 0)
        self.port = self._server.socket.getsockname()[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _handle(self, connection) -> None:
        self.handshakes += 1
        connection.close(code=self.code, reason="refused")

    def __enter__(self) -> ClosingServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join(5)


@pytest.fixture
def listener_for() -> Iterator:
    made: list[PushListener] = []

    def make(port: int, **options) -> PushListener:
        listener = PushListener(
            url=f"ws://127.0.0.1:{port}/ws/agent/runs/run_1/",
            bearer_token="ss_wrong",
            on_signal=lambda signal: None,
            min_backoff=0.05,
            max_backoff=0.1,
            **options,
        )
        made.append(listener)
        listener.start()
        return listener

    yield make
    for listener in made:
        listener.stop(timeout=5)


@pytest.mark.parametrize("code", [4401, 4404])
def test_a_refused_token_or_run_is_not_retried(code, listener_for, caplog):
    with ClosingServer(code) as server:
        listener = listener_for(server.port)
        listener._thread.join(5)  # the listener gives up: its thread ends
        assert not listener._thread.is_alive()
        time.sleep(0.5)  # with the backoff of 0.05-0.1 s, ~5 more handshakes would come
        assert server.handshakes == 1
    assert f"refused ({code}" in caplog.text and "relying on heartbeats" in caplog.text


def test_a_throttled_address_waits_the_window_out(listener_for):
    with ClosingServer(4429) as server:
        listener = listener_for(server.port, throttled_wait=30.0)
        deadline = time.monotonic() + 5
        while server.handshakes < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.0)  # the ordinary backoff (0.05-0.1 s) would have made ~10 handshakes
        assert server.handshakes == 1
        assert listener._thread.is_alive()  # still trying, later


def test_another_close_is_retried_with_the_usual_backoff(listener_for):
    with ClosingServer(1011) as server:  # a server error: worth retrying soon
        listener_for(server.port)
        deadline = time.monotonic() + 5
        while server.handshakes < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.handshakes >= 3
