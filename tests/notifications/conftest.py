"""Real parts for the notification tests: a webhook receiver that checks signatures with the
Standard Webhooks package's own verifier, a black-hole TCP target, channels on the shared team."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from notifications import services as notify
from notifications.models import NotificationChannel
from runs.actors import Actor

ADMIN = Actor.system("test-admin")


@dataclass
class Hit:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    verify_error: str = ""


@dataclass
class Receiver:
    """An HTTP target. `answers` is a queue of (status, body) to answer with (then 200);
    `hang` makes it read the request and never answer until the test ends."""

    host: str = ""
    secret: str = ""
    hits: list[Hit] = field(default_factory=list)
    answers: list[tuple[int, str]] = field(default_factory=list)
    hang: bool = False
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str = "/hook") -> str:
        return f"http://{self.host}{path}"

    def ids(self) -> list[str]:
        return [hit.headers.get("webhook-id", "") for hit in self.hits]


def _serve(receiver: Receiver) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {key.lower(): value for key, value in self.headers.items()}
            verified, error = False, ""
            if receiver.secret:
                try:
                    Webhook(receiver.secret).verify(body, headers)
                    verified = True
                except WebhookVerificationError as exc:
                    error = str(exc)
            with receiver.lock:
                receiver.hits.append(Hit(self.path, headers, body, verified, error))
                status, text = receiver.answers.pop(0) if receiver.answers else (200, "ok")
            if receiver.hang:
                receiver.released.wait(30)
                return
            data = text.encode()
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "http://elsewhere.invalid/")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


@pytest.fixture
def receiver(settings: Any) -> Iterator[Receiver]:
    receiver = Receiver()
    server = _serve(receiver)
    receiver.host = f"127.0.0.1:{server.server_address[1]}"
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [receiver.host]
    settings.SAFESTOP_WEBHOOK_READ_TIMEOUT = 0.5
    settings.SAFESTOP_WEBHOOK_CONNECT_TIMEOUT = 0.5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    yield receiver
    receiver.released.set()
    server.shutdown()
    server.server_close()


@dataclass
class BlackHole:
    """Accepts TCP connections and never answers: counts who connected, and when."""

    host: str
    connections: list[float] = field(default_factory=list)


@pytest.fixture
def black_hole(settings: Any) -> Iterator[BlackHole]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.05)
    hole = BlackHole(host=f"127.0.0.1:{listener.getsockname()[1]}")
    held: list[socket.socket] = []
    stopping = threading.Event()

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            hole.connections.append(time.monotonic())
            held.append(conn)  # never read, never answered, never closed until the end

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [*settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS, hole.host]
    settings.SAFESTOP_WEBHOOK_READ_TIMEOUT = 0.3
    settings.SAFESTOP_WEBHOOK_CONNECT_TIMEOUT = 0.3
    yield hole
    stopping.set()
    thread.join(2)
    for conn in held:
        conn.close()
    listener.close()


def _make_channel(
    team: Any, target: str, *, kind: str = "webhook", **fields: Any
) -> tuple[NotificationChannel, str]:
    created = notify.channel_create(
        team=team,
        name=fields.pop("name", f"{kind}-{NotificationChannel.objects.count() + 1}"),
        kind=kind,
        target=target,
        actor=ADMIN,
        **fields,
    )
    return created.channel, created.secret


@pytest.fixture
def make_channel(db: None) -> Any:
    """`make_channel(team, target, kind=..., events=..., agent_glob=...)` → (channel, secret)."""
    return _make_channel


@pytest.fixture
def webhook(team: Any, receiver: Receiver) -> NotificationChannel:
    channel, secret = _make_channel(team, receiver.url(), name="ops-webhook")
    receiver.secret = secret
    return channel


@dataclass
class Mailbox:
    """What a real SMTP server (aiosmtpd) on 127.0.0.1 received."""

    port: int
    envelopes: list[Any] = field(default_factory=list)

    def messages(self) -> list[Any]:
        from email import message_from_bytes, policy

        return [message_from_bytes(env.content, policy=policy.default) for env in self.envelopes]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def smtp_server(settings: Any) -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller

    mailbox = Mailbox(port=_free_port())

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            mailbox.envelopes.append(envelope)
            return "250 Message accepted for delivery"

    controller = Controller(Handler(), hostname="127.0.0.1", port=mailbox.port)
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = mailbox.port
    settings.EMAIL_USE_TLS = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_TIMEOUT = 2
    yield mailbox
    controller.stop()
