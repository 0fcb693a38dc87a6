"""Transports against a real HTTP receiver: what each answer means, and the allow-list."""

from __future__ import annotations

import socket

import pytest
from django.core import mail

from runs import dispatch, services, transports
from runs.actors import Actor
from runs.errors import InvalidInput
from runs.models import OutboxItem, OutboxStatus
from tests.support.scenarios import make_running

AGENT = Actor.system("agent")


def _enqueue(
    run, url: str, key: str = "k-1", payload: dict | None = None, transport: str = "webhook"
) -> OutboxItem:
    item, created = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport=transport,
        destination=url,
        payload=payload if payload is not None else {"text": "hello", "n": 1},
        idempotency_key=key,
        actor=AGENT,
    )
    assert created
    return item


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_webhook_posts_the_payload_as_json_with_the_idempotency_key(receiver) -> None:
    result = transports.webhook_send(
        destination=receiver.url("/hook"),
        payload={"text": "hi", "n": [1, 2]},
        idempotency_key="key-123",
        run_id="run_abc",
    )
    assert result == transports.SendResult(OutboxStatus.SENT, 200, "")
    [receipt] = receiver.receipts
    assert receipt.path == "/hook"
    assert receipt.idempotency_key == "key-123"
    assert receipt.body == {"text": "hi", "n": [1, 2]}
    assert receipt.headers["Content-Type"] == "application/json"


def test_webhook_rechecks_the_allow_list_at_send_time(receiver, settings) -> None:
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    result = transports.webhook_send(destination=receiver.url(), payload={}, idempotency_key="k")
    assert result.outcome == OutboxStatus.FAILED
    assert "not sent" in result.error
    assert receiver.count() == 0


def test_allow_list_matches_the_port_too(receiver, settings) -> None:
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [f"127.0.0.1:{receiver.port + 1}"]
    assert (
        transports.webhook_send(destination=receiver.url(), payload={}, idempotency_key="k").outcome
        == "failed"
    )
    assert receiver.count() == 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_to_a_host_off_the_allow_list_is_refused_and_nothing_is_contacted(
    team, receiver, settings
) -> None:
    run, _lease = make_running(team)
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    with pytest.raises(InvalidInput) as refused:
        _enqueue(run, receiver.url())
    assert refused.value.http_status == 400
    assert refused.value.as_dict()["error"] == "invalid"
    assert refused.value.extra["field"] == "destination"
    assert not OutboxItem.objects.filter(run=run).exists()
    assert dispatch.dispatch_pending() == 0
    assert receiver.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_host_removed_from_the_allow_list_after_enqueue_is_never_contacted(
    team, receiver, settings
) -> None:
    run, _lease = make_running(team)
    item = _enqueue(run, receiver.url())
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = []
    settled = dispatch.dispatch_one(item)
    assert settled is not None and settled.status == OutboxStatus.FAILED
    assert "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in settled.last_error
    assert receiver.count() == 0


def test_redirects_are_not_followed(receiver) -> None:
    # The redirect target is even on the allow-list: following it is still not our call.
    receiver.redirect_to = receiver.url("/elsewhere")
    result = transports.webhook_send(
        destination=receiver.url("/redirect"), payload={}, idempotency_key="k"
    )
    assert result.outcome == OutboxStatus.FAILED
    assert result.response_status == 302
    assert [r.path for r in receiver.receipts] == ["/redirect"]


def test_connection_refused_before_sending_is_failed(settings) -> None:
    port = _closed_port()
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [f"127.0.0.1:{port}"]
    result = transports.webhook_send(
        destination=f"http://127.0.0.1:{port}/", payload={}, idempotency_key="k"
    )
    assert result.outcome == OutboxStatus.FAILED
    assert "ConnectError" in result.error


def test_read_timeout_after_the_request_went_out_is_unknown(receiver, settings) -> None:
    settings.SAFESTOP_WEBHOOK_READ_TIMEOUT = 0.2
    result = transports.webhook_send(
        destination=receiver.url("/slow/1.0"), payload={"x": 1}, idempotency_key="k"
    )
    assert result.outcome == OutboxStatus.UNKNOWN
    assert "ReadTimeout" in result.error
    # ...and that is exactly why: the receiver did get it.
    assert receiver.count("k") == 1


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (201, "sent"),
        (204, "sent"),
        (400, "failed"),
        (409, "failed"),
        (500, "unknown"),
        (503, "unknown"),
    ],
)
def test_response_status_decides_the_outcome(receiver, status: int, outcome: str) -> None:
    result = transports.webhook_send(
        destination=receiver.url(f"/status/{status}"), payload={}, idempotency_key="k"
    )
    assert (result.outcome, result.response_status) == (outcome, status)


@pytest.mark.django_db(transaction=True)
def test_email_goes_through_the_django_backend_with_the_idempotency_key(team) -> None:
    run, _lease = make_running(team)
    item = _enqueue(
        run,
        "ops@example.com",
        key="mail-1",
        transport="email",
        payload={"subject": "Deploy finished", "body": "All green."},
    )
    settled = dispatch.dispatch_one(item)
    assert settled is not None and settled.status == OutboxStatus.SENT
    [message] = mail.outbox
    assert message.to == ["ops@example.com"]
    assert message.subject == "Deploy finished"
    assert message.body == "All green."
    rendered = message.message()
    assert rendered["Idempotency-Key"] == "mail-1"
    assert rendered["Message-ID"] == transports.email_message_id(
        run_id=run.pk, idempotency_key="mail-1"
    )


def test_email_to_an_unreachable_smtp_server_is_failed_not_unknown(settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = _closed_port()
    settings.EMAIL_TIMEOUT = 2
    result = transports.email_send(
        destination="ops@example.com", payload={"body": "x"}, idempotency_key="k"
    )
    assert result.outcome == OutboxStatus.FAILED
    assert "ConnectionRefusedError" in result.error
