"""A tiny webhook receiver for the dispatch tests (their `receiver` fixture): a real HTTP server on 127.0.0.1 in a thread.

It records every request (path, Idempotency-Key header, JSON body) the moment the request has
been read — before answering — so a test can tell "the receiver got it" apart from "the
dispatcher heard back". Behaviour per path:

- `/ok` (anything else): 200;
- `/status/<code>`: answers that status;
- `/redirect`: 302 to `redirect_to`;
- `/slow/<seconds>`: waits, then 200 (read timeouts);
- `/block`: waits until `release()` (a dispatcher stuck mid-send).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Receipt:
    path: str
    idempotency_key: str
    body: Any
    headers: dict[str, str]
    at: float


class WebhookReceiver:
    def __init__(self) -> None:
        self.receipts: list[Receipt] = []
        self.redirect_to = ""
        self._lock = threading.Lock()
        self._unblock = threading.Event()
        self._got_request = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode(errors="replace")
                receiver._record(
                    Receipt(
                        self.path,
                        self.headers.get("Idempotency-Key", ""),
                        body,
                        dict(self.headers.items()),
                        time.time(),
                    )
                )
                receiver._respond(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="webhook-receiver",
            daemon=True,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self._unblock.set()
        self.server.shutdown()
        self.server.server_close()

    # -- helpers for tests -------------------------------------------------------------------

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/ok") -> str:
        return f"http://{self.host}{path}"

    def keys(self) -> list[str]:
        with self._lock:
            return [receipt.idempotency_key for receipt in self.receipts]

    def count(self, key: str | None = None) -> int:
        with self._lock:
            if key is None:
                return len(self.receipts)
            return sum(1 for receipt in self.receipts if receipt.idempotency_key == key)

    def duplicates(self) -> dict[str, int]:
        return {key: n for key, n in Counter(self.keys()).items() if n > 1}

    def wait_for(self, count: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._got_request:
            while len(self.receipts) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._got_request.wait(left)
        return True

    def release(self) -> None:
        self._unblock.set()

    # -- server side -------------------------------------------------------------------------

    def _record(self, receipt: Receipt) -> None:
        with self._got_request:
            self.receipts.append(receipt)
            self._got_request.notify_all()

    def _respond(self, handler: BaseHTTPRequestHandler) -> None:
        path = handler.path
        status, headers = 200, {}
        if path.startswith("/status/"):
            status = int(path.rsplit("/", 1)[1])
        elif path == "/redirect":
            status, headers = 302, {"Location": self.redirect_to}
        elif path.startswith("/slow/"):
            time.sleep(float(path.rsplit("/", 1)[1]))
        elif path == "/block":
            self._unblock.wait(60)
        body = b'{"ok": true}' if status < 300 else b'{"ok": false}'
        try:
            handler.send_response(status)
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
        except OSError:
            pass  # the client gave up (timeout) or was killed: that is what some tests do
