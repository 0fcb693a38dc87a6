"""Every channel kind obeys the webhook destination rule (`SAFESTOP_WEBHOOK_ALLOWED_HOSTS`):
allowed hosts only, no redirect followed, TLS verified — Apprise URLs included, at save and at
send. Real listeners on 127.0.0.1 show which hosts were contacted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client

from console import settings as shipped
from notifications import services as notify
from notifications.models import Delivery, NotificationChannel
from runs.errors import InvalidInput
from tests.support.scenarios import stopped_dirty

pytestmark = pytest.mark.django_db


@dataclass
class Listener:
    """Answers every request (any method) with `status`, and `Location: location` on a 3xx."""

    status: int = 200
    location: str = ""
    hits: list[tuple[str, str]] = field(default_factory=list)  # (method, path)
    host: str = ""

    def url(self, scheme: str, path: str = "/hook") -> str:
        return f"{scheme}://{self.host}{path}"


@pytest.fixture
def listeners() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def make(**kwargs: Any) -> Listener:
        listener = Listener(**kwargs)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                listener.hits.append((self.command, self.path))
                self.send_response(listener.status)
                if listener.location:
                    self.send_header("Location", listener.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = do_PUT = _answer

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        listener.host = f"127.0.0.1:{server.server_address[1]}"
        threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        servers.append(server)
        return listener

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()


def _send_all() -> int:
    return notify.deliveries_send_due(limit=20, sender="test-sender")


def test_msteams_is_off_the_default_schemes_and_refused():
    assert "msteams" not in shipped.SAFESTOP_NOTIFY_APPRISE_SCHEMES
    assert "workflows" in shipped.SAFESTOP_NOTIFY_APPRISE_SCHEMES


def test_a_workflows_url_to_a_host_off_the_allow_list_is_refused_at_save(
    team, make_channel, settings
):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.slack.com"]
    with pytest.raises(InvalidInput, match="SAFESTOP_WEBHOOK_ALLOWED_HOSTS") as refused:
        make_channel(team, "workflows://127.0.0.1:6379/flow/sig", kind="apprise")
    assert "127.0.0.1:6379" in refused.value.detail
    with pytest.raises(InvalidInput, match="Apprise URL must start"):
        make_channel(team, "msteams://a/b/c", kind="apprise")
    # A fixed-host service needs its host on the list too.
    with pytest.raises(InvalidInput, match="discord.com"):
        make_channel(team, "discord://123/abc", kind="apprise")
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["discord.com"]
    make_channel(team, "discord://123/abc", kind="apprise")
    assert not NotificationChannel.objects.filter(target__startswith="workflows").exists()


def test_tls_checks_and_redirects_cannot_be_turned_on_or_off_by_the_url(
    team, make_channel, settings
):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["flows.example.com"]
    with pytest.raises(InvalidInput, match="verify=no"):
        make_channel(team, "workflows://flows.example.com/flow/sig?verify=no", kind="apprise")
    settings.SAFESTOP_NOTIFY_APPRISE_SCHEMES = ["json"]
    with pytest.raises(InvalidInput, match="redirect"):
        make_channel(team, "json://flows.example.com/x?redirect=yes", kind="apprise")


def test_a_host_dropped_from_the_list_is_never_contacted_at_send(
    team, make_channel, black_hole, settings
):
    """The port-oracle case: a stored `workflows://127.0.0.1:<port>` is refused at send, before
    any connection, and fails for good with the reason (never pending, never retried)."""
    make_channel(team, f"workflows://{black_hole.host}/flow/sig", kind="apprise")
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = []
    stopped_dirty(team)
    _send_all()
    assert black_hole.connections == []
    delivery = Delivery.objects.get()
    assert delivery.status == "failed" and "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in delivery.last_error


def test_an_apprise_target_that_redirects_is_not_followed(team, make_channel, settings, listeners):
    inside = listeners()  # an internal service, even one on the allow-list
    edge = listeners(status=302, location=inside.url("http", "/internal-via-redirect"))
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [edge.host, inside.host]
    settings.SAFESTOP_NOTIFY_APPRISE_SCHEMES = ["json"]
    make_channel(team, edge.url("json"), kind="apprise")
    stopped_dirty(team)
    _send_all()
    assert [method for method, _ in edge.hits] == ["POST"]
    assert inside.hits == []
    assert Delivery.objects.get().status != "sent"


def test_a_stored_redirect_or_verify_flag_is_overridden_at_send(
    team, make_channel, settings, listeners
):
    """A target written before these checks (or straight into the database) still never follows
    a redirect: the plugin is pinned at send, and the request guard refuses the host anyway."""
    inside = listeners()
    edge = listeners(status=302, location=inside.url("http", "/internal-via-redirect"))
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [edge.host]
    settings.SAFESTOP_NOTIFY_APPRISE_SCHEMES = ["json"]
    channel, _ = make_channel(team, edge.url("json"), kind="apprise")
    NotificationChannel.objects.filter(pk=channel.pk).update(
        target=edge.url("json") + "?redirect=yes"
    )
    stopped_dirty(team)
    _send_all()
    assert inside.hits == [] and edge.hits == []
    delivery = Delivery.objects.get()
    assert delivery.status == "failed" and "redirect" in delivery.last_error


def test_the_console_form_shows_the_refusal_at_the_target_field(alice, settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = []
    client = Client()
    client.force_login(alice)
    response = client.post(
        "/notifications/",
        {
            "team": "acme",
            "name": "flows",
            "kind": "apprise",
            "target": "workflows://127.0.0.1:6379/flow/sig",
            "events": ["run.stopped_dirty"],
        },
    )
    assert response.status_code == 400
    [error] = response.context["form"].errors["target"]
    assert "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in error
    assert 'id="c-target-error"' in response.content.decode()
    assert not NotificationChannel.objects.exists()
