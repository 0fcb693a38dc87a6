"""A local webhook receiver: where the demo's (and the fault tests') outbox items land.

A real HTTP server on 127.0.0.1 in a daemon thread. It plays a business system that
deduplicates by `Idempotency-Key`: the first request with a key is *applied*, repeats are
recorded as duplicates and change nothing. So a test can tell "the receiver got it" (a
receipt) from "the business effect happened" (applied) and catch a double send.

Paths (POST):
- anything else: 200, applied;
- `/drop/...`: applied, then the connection is closed without an answer — the remote did
  the work but the response was lost (seed 001 §6: "远端完成，但响应丢失");
- `/slow/<seconds>/...`: waits, then 200;
- `/status/<code>/...`: answers that status (a 4xx/5xx is not applied).

GET `/receipts` lists every receipt; GET `/operations/<key>` answers whether that key was
applied — what a `query_original` recovery asks before deciding anything.
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_PORT = 8099


@dataclass(frozen=True)
class Receipt:
    path: str
    idempotency_key: str
    run_id: str
    body: Any
    at: float
    duplicate: bool
    answered: int | None  # HTTP status sent, or None when the answer was dropped


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int = DEFAULT_PORT, host: str = "127.0.0.1") -> int:
    """The preferred port if it is free, else one the kernel picks (bound and released)."""
    if preferred and port_is_free(preferred, host):
        return preferred
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class WebhookReceiver:
    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.receipts: list[Receipt] = []
        self._applied: set[str] = set()
        self._lock = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                receiver._handle_post(self)

            def do_GET(self) -> None:
                receiver._handle_get(self)

        try:
            self.server = _Server((host, port), Handler)
        except OSError as error:
            if error.errno != errno.EADDRINUSE or port == 0:
                raise
            self.server = _Server((host, 0), Handler)  # the preferred port is busy: any port
        self.host_name = host
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="demo-webhook-receiver",
            daemon=True,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- for callers -------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """host:port, as it goes on SAFESTOP_WEBHOOK_ALLOWED_HOSTS."""
        return f"{self.host_name}:{self.port}"

    def url(self, path: str = "/hooks/demo") -> str:
        return f"http://{self.host}{path}"

    def count(self, key: str | None = None) -> int:
        with self._lock:
            return sum(1 for r in self.receipts if key is None or r.idempotency_key == key)

    def applied(self, key: str) -> bool:
        with self._lock:
            return key in self._applied

    def applied_count(self) -> int:
        with self._lock:
            return len(self._applied)

    def duplicates(self) -> dict[str, int]:
        with self._lock:
            counts = Counter(r.idempotency_key for r in self.receipts)
        return {key: n for key, n in counts.items() if n > 1}

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.receipts) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    # -- server side -------------------------------------------------------------------------

    def _handle_post(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = raw.decode(errors="replace")
        key = handler.headers.get("Idempotency-Key", "")
        path = handler.path
        status: int | None = 200
        if path.startswith("/status/"):
            status = int(path.split("/")[2])
        elif path.startswith("/slow/"):
            time.sleep(float(path.split("/")[2]))
        elif path.startswith("/drop"):
            status = None
        with self._lock:
            duplicate = bool(key) and key in self._applied
            if key and (status is None or status < 300):
                self._applied.add(key)
            self.receipts.append(
                Receipt(
                    path,
                    key,
                    handler.headers.get("X-Safestop-Run", ""),
                    body,
                    time.time(),
                    duplicate,
                    status,
                )
            )
            self._lock.notify_all()
        if status is None:
            # The work is done, the answer never arrives: close without a status line.
            handler.close_connection = True
            try:
                handler.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self._answer(handler, status, {"ok": status < 300, "duplicate": duplicate})

    def _handle_get(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path.rstrip("/")
        if path == "/receipts":
            with self._lock:
                receipts = [asdict(r) for r in self.receipts]
            self._answer(handler, 200, {"receipts": receipts})
        elif path.startswith("/operations/"):
            key = path[len("/operations/") :]
            self._answer(
                handler,
                200,
                {"idempotency_key": key, "applied": self.applied(key), "requests": self.count(key)},
            )
        elif path == "/healthz":
            self._answer(handler, 200, {"ok": True})
        else:
            self._answer(handler, 404, {"error": "not_found"})

    @staticmethod
    def _answer(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:
            pass  # the client gave up: nothing to tell it
