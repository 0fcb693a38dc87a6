"""The two ways a stop reaches a worker: the websocket push and the lease heartbeat.

Both run in daemon threads and do one thing with what they learn: hand the
stop signal to a callback that sets the run's `CancelToken`. The push socket
also carries other frames (an approval's decision, DESIGN §10); those go to a
second callback. The push is the
fast path (milliseconds); the heartbeat is the path that always works, even
when websockets are blocked, and it also notices a lost lease.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from ._version import USER_AGENT, VERSION_HEADER, __version__
from .errors import ApiError, ClientDisconnected

log = logging.getLogger("safestop_agent")

# Close codes of the push socket (docs/api.md). 4401 and 4404 will not change by reconnecting,
# and every attempt with a wrong token spends the address's wrong-token budget: once it is spent
# the server closes every handshake from the address with 4429, other workers' on this host too.
# 4429 asks the address to wait for the rest of the minute.
CLOSE_REFUSED = {4401: "token refused", 4404: "no such run"}
CLOSE_THROTTLED = 4429
THROTTLED_WAIT_SECONDS = 60.0

SignalHandler = Callable[[Mapping[str, Any]], object]
FrameHandler = Callable[[dict[str, Any]], object]
LeaseLostHandler = Callable[[str, "int | None"], None]


class HeartbeatLoop:
    """Renews the lease every `interval` seconds and reports stop signals and a lost lease.

    A 409 on heartbeat means the lease was revoked or expired; so does going
    longer than the lease's TTL without one successful renewal, because by then
    the server has fenced this worker off whether or not we heard about it.
    """

    def __init__(
        self,
        *,
        beat: Callable[[], Mapping[str, Any]],
        interval: float,
        ttl_seconds: float,
        on_signal: SignalHandler,
        on_lease_lost: LeaseLostHandler,
        name: str = "safestop-heartbeat",
    ) -> None:
        self.interval = interval
        self.ttl_seconds = ttl_seconds
        self._beat = beat
        self._on_signal = on_signal
        self._on_lease_lost = on_lease_lost
        self._stopping = threading.Event()
        self._last_renewed = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._last_renewed = time.monotonic()
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            if not self.beat_once():
                return

    def beat_once(self) -> bool:
        """One renewal; False once the lease is lost and beating further is pointless."""
        try:
            answer = self._beat()
        except ClientDisconnected:
            # Its owner shut the client down while this thread was between two beats (a
            # simulator's exit, a lease block whose stop's join timed out): nothing to renew.
            log.info("safestop heartbeat: the client was disconnected; stopping")
            return False
        except ApiError as error:
            if error.status_code in (404, 409, 410):
                self._on_lease_lost(error.code, error.stop_epoch)
                return False
            log.warning("safestop heartbeat refused: %s", error)
        except httpx.TransportError as error:
            log.warning("safestop heartbeat failed: %r", error)
        else:
            self._last_renewed = time.monotonic()
            signal = answer.get("signal") if isinstance(answer, Mapping) else None
            if signal:
                self._on_signal(signal)
            return True
        if time.monotonic() - self._last_renewed > self.ttl_seconds:
            self._on_lease_lost("lease_expired", None)
            return False
        return True


class PushListener:
    """Keeps a websocket open to the run's push channel, reconnecting with backoff.

    Agents are not browsers: the handshake carries the bearer token and no
    Origin. A connection that dies is retried (with backoff up to `max_backoff`)
    until `stop()`; the heartbeat covers the gaps. A refusal is not retried
    (4401 token refused, 4404 no such run), and a throttled address (4429)
    waits `throttled_wait` seconds before its next attempt.
    """

    # A connection that stayed up this long was healthy: start the backoff over.
    HEALTHY_CONNECTION_SECONDS = 5.0

    def __init__(
        self,
        *,
        url: str,
        bearer_token: str,
        on_signal: SignalHandler,
        on_frame: FrameHandler | None = None,
        min_backoff: float = 0.2,
        max_backoff: float = 10.0,
        poll_seconds: float = 0.5,
        throttled_wait: float = THROTTLED_WAIT_SECONDS,
        name: str = "safestop-push",
    ) -> None:
        self.url = url
        self._headers = {
            "Authorization": f"Bearer {bearer_token}",
            VERSION_HEADER: __version__,
        }
        self._on_signal = on_signal
        self._on_frame = on_frame
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._poll_seconds = poll_seconds
        self._throttled_wait = throttled_wait
        self._stopping = threading.Event()
        self._connection: Any = None
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stopping.set()
        connection = self._connection
        if connection is not None:
            # Closing from here wakes a recv() blocked in the listener thread.
            try:
                connection.close()
            except Exception:  # already closing or broken: nothing left to release
                log.debug("safestop push: close failed", exc_info=True)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            from websockets.sync.client import connect
        except ImportError:
            log.warning("safestop push disabled: install 'websockets'; relying on heartbeats")
            return
        backoff = self._min_backoff
        while not self._stopping.is_set():
            opened_at = time.monotonic()
            code: int | None = None
            try:
                with connect(
                    self.url,
                    additional_headers=self._headers,
                    user_agent_header=USER_AGENT,
                    open_timeout=10,
                    close_timeout=1,
                ) as connection:
                    self._connection = connection
                    self.connected.set()
                    self._receive_until_closed(connection)
            except Exception as error:  # any failure means "reconnect later", never "crash the run"
                code = close_code(error)
                if code in CLOSE_REFUSED and not self._stopping.is_set():
                    log.warning(
                        "safestop push refused (%s, %s); relying on heartbeats",
                        code,
                        CLOSE_REFUSED[code],
                    )
                    return
                if not self._stopping.is_set():
                    log.info("safestop push connection lost: %r", error)
            finally:
                self._connection = None
                self.connected.clear()
            if time.monotonic() - opened_at >= self.HEALTHY_CONNECTION_SECONDS:
                backoff = self._min_backoff
            wait = max(backoff, self._throttled_wait) if code == CLOSE_THROTTLED else backoff
            if self._stopping.wait(wait):
                return
            backoff = min(self._max_backoff, backoff * 2)

    def _receive_until_closed(self, connection: Any) -> None:
        while not self._stopping.is_set():
            try:
                message = connection.recv(timeout=self._poll_seconds)
            except TimeoutError:
                continue
            frame = frame_in(message)
            if frame is None:
                continue
            signal = stop_signal_of(frame)
            if signal is not None:
                self._on_signal(signal)
                self._acknowledge(connection, signal)
            elif self._on_frame is not None:
                try:
                    self._on_frame(frame)
                except Exception:  # one bad frame must not cost the stop channel
                    log.exception("safestop push: frame handler failed")

    def _acknowledge(self, connection: Any, signal: Mapping[str, Any]) -> None:
        # Telling the server at once that the worker saw the stop moves the run
        # to `draining` without waiting for the next heartbeat (which also acks).
        try:
            connection.send(json.dumps({"type": "ack", "stop_epoch": signal.get("stop_epoch")}))
        except Exception:  # a lost ack is covered by the heartbeat's
            log.debug("safestop push: ack not sent", exc_info=True)


def close_code(error: BaseException) -> int | None:
    """The close code the server sent, when `error` is websockets' ConnectionClosed."""
    received = getattr(error, "rcvd", None)
    code = getattr(received, "code", None)
    return code if isinstance(code, int) else None


def frame_in(message: str | bytes) -> dict[str, Any] | None:
    """A pushed message as a JSON object, or None."""
    try:
        frame = json.loads(message)
    except ValueError:
        return None
    return frame if isinstance(frame, dict) else None


def stop_signal_in(message: str | bytes) -> dict[str, Any] | None:
    """The stop signal in a pushed message (see `stop_signal_of`)."""
    frame = frame_in(message)
    return None if frame is None else stop_signal_of(frame)


def stop_signal_of(frame: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stop signal in a pushed frame: the frame itself, or its `signal` member."""
    if frame.get("type") == "cancel_requested":
        return dict(frame)
    signal = frame.get("signal")
    if isinstance(signal, dict) and signal.get("type") == "cancel_requested":
        return signal
    return None
