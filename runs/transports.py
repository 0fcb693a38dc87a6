"""Transports: how a claimed outbox item actually leaves the building (DESIGN §6).

A transport never raises and never touches the database. It answers what it *knows*:

- `sent`: the receiver accepted it (2xx, or the mail backend took it);
- `failed`: it certainly did not happen — refused before a byte of the request went out (not on
  the allow-list, connection refused, connect timeout), or the receiver answered "no" (3xx not
  followed, 4xx);
- `unknown`: the request may have been received and acted on, but no answer arrived (read or
  write timeout, connection dropped mid-exchange, a 5xx). Never retried, never assumed failed:
  a reviewer resolves it.

Every send carries the item's idempotency key so a receiver can deduplicate.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import smtplib
import ssl
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.serializers.json import DjangoJSONEncoder

from runs.errors import InvalidInput
from runs.models import OutboxItem, OutboxStatus
from runs.services import validate_outbox_destination

logger = logging.getLogger(__name__)

USER_AGENT = "safestop-dispatcher/1"


@dataclass(frozen=True, slots=True)
class SendResult:
    outcome: str  # one of runs.services.OUTBOX_OUTCOMES
    response_status: int | None = None
    error: str = ""

    @classmethod
    def sent(cls, response_status: int | None = None) -> SendResult:
        return cls(OutboxStatus.SENT, response_status)

    @classmethod
    def failed(cls, error: str, response_status: int | None = None) -> SendResult:
        return cls(OutboxStatus.FAILED, response_status, error)

    @classmethod
    def unknown(cls, error: str, response_status: int | None = None) -> SendResult:
        return cls(OutboxStatus.UNKNOWN, response_status, error)


def send(item: OutboxItem) -> SendResult:
    """Send one claimed item with its transport. Call it outside any transaction."""
    sender = _SENDERS.get(item.transport)
    if sender is None:
        return SendResult.failed(f"no transport {item.transport!r}")
    try:
        return sender(
            destination=item.destination,
            payload=item.payload,
            idempotency_key=item.idempotency_key,
            run_id=item.run_id,
        )
    except Exception as exc:  # a transport bug after the request may have left: not knowable
        logger.exception("transport %s crashed on %s", item.transport, item.public_id)
        return SendResult.unknown(f"transport crashed: {type(exc).__name__}: {exc}"[:2000])


# --------------------------------------------------------------------------------------------
# webhook


def webhook_timeout() -> httpx.Timeout:
    connect = settings.SAFESTOP_WEBHOOK_CONNECT_TIMEOUT
    read = settings.SAFESTOP_WEBHOOK_READ_TIMEOUT
    return httpx.Timeout(connect=connect, read=read, write=read, pool=connect)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # Building a verifying context loads the CA bundle (~25 ms of CPU); do it once per process.
    # An SSLContext is safe to share between threads and clients.
    return httpx.create_ssl_context()


def webhook_send(
    *, destination: str, payload: Any, idempotency_key: str, run_id: str = ""
) -> SendResult:
    """POST `payload` as JSON to `destination`, with the `Idempotency-Key` header.

    The allow-list is checked again here, at send time: the list may have shrunk since the item
    was enqueued, and a destination that is no longer allowed is never contacted. Redirects are
    not followed (a 3xx would otherwise send the payload to a host nobody allowed), and
    `trust_env=False` keeps proxy variables from routing the request anywhere else.
    """
    try:
        validate_outbox_destination("webhook", destination)
    except InvalidInput as refused:
        return SendResult.failed(f"not sent: {refused.detail}")
    body = json.dumps(payload, cls=DjangoJSONEncoder).encode()
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": idempotency_key,
        "User-Agent": USER_AGENT,
    }
    if run_id:
        headers["X-Safestop-Run"] = run_id
    try:
        # A fresh client per send: no pooled connection whose staleness could turn a clean
        # "connection refused" into an ambiguous mid-request error.
        with httpx.Client(
            timeout=webhook_timeout(),
            follow_redirects=False,
            trust_env=False,
            verify=_tls_context(),
        ) as client:
            response = client.post(destination, content=body, headers=headers)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        # No connection was ever established, so no byte of the request was sent.
        return SendResult.failed(f"not sent: {type(exc).__name__}: {exc}"[:2000])
    except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError) as exc:
        return SendResult.failed(f"not sent: {type(exc).__name__}: {exc}"[:2000])
    except httpx.TransportError as exc:
        # Read/write timeout, reset or close mid-exchange: the receiver may have acted on it.
        return SendResult.unknown(f"no answer: {type(exc).__name__}: {exc}"[:2000])
    return _classify_response(response)


def _classify_response(response: httpx.Response) -> SendResult:
    status = response.status_code
    if 200 <= status < 300:
        return SendResult.sent(status)
    if 300 <= status < 400:
        location = response.headers.get("location", "")
        return SendResult.failed(f"redirect to {location!r} not followed", status)
    if 400 <= status < 500:
        return SendResult.failed(
            f"refused by receiver: HTTP {status} {response.text[:300]}", status
        )
    # A 5xx says the receiver broke while handling it, not that it did nothing.
    return SendResult.unknown(f"receiver error: HTTP {status} {response.text[:300]}", status)


# --------------------------------------------------------------------------------------------
# email


def email_message_id(*, run_id: str, idempotency_key: str) -> str:
    """A Message-ID derived from the item, so a resend is recognisably the same message."""
    digest = hashlib.sha256(f"{run_id}\x00{idempotency_key}".encode()).hexdigest()[:40]
    return f"<{digest}@safestop>"


# Raised when the server refused the message: it certainly was not delivered.
_SMTP_REFUSED = (
    smtplib.SMTPSenderRefused,
    smtplib.SMTPRecipientsRefused,
    smtplib.SMTPDataError,
    smtplib.SMTPNotSupportedError,
)


# Characters that end a header line somewhere (Django refuses CR and LF with BadHeaderError;
# other parsers also split on these), and every other control character.
_NOT_IN_HEADERS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")


def header_value(text: str, *, limit: int = 250) -> str:
    """`text` made safe for one mail header: line breaks and control characters become one
    space. Every header value built from someone's words (an agent's subject, a run title, a
    tool name) goes through here where it is made, so a newline can neither inject a header nor
    make the message unsendable."""
    return " ".join(_NOT_IN_HEADERS.sub(" ", text).split())[:limit]


def email_send(
    *, destination: str, payload: Any, idempotency_key: str, run_id: str = ""
) -> SendResult:
    """Send through Django's email backend; the idempotency key is in the headers.

    The connection is opened first, on its own: a failure there (refused, timed out, bad
    credentials) happened before the message left, so it is `failed`; a failure after the
    message was handed over is `unknown` unless the server explicitly refused it.
    """
    try:
        validate_outbox_destination("email", destination)
    except InvalidInput as refused:
        return SendResult.failed(f"not sent: {refused.detail}")
    data = payload if isinstance(payload, dict) else {"body": payload}
    subject = header_value(str(data.get("subject") or "")) or "safestop notification"
    body = data.get("body")
    if not isinstance(body, str):
        body = json.dumps(data, cls=DjangoJSONEncoder, indent=2, sort_keys=True)
    connection = get_connection(fail_silently=False)
    message = EmailMessage(
        subject=subject,
        body=body,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[destination],
        connection=connection,
        headers={
            "Message-ID": email_message_id(run_id=run_id, idempotency_key=idempotency_key),
            "Idempotency-Key": idempotency_key,
            "X-Safestop-Run": run_id,
        },
    )
    try:
        connection.open()
    except Exception as exc:
        return SendResult.failed(f"not sent: {type(exc).__name__}: {exc}"[:2000])
    try:
        delivered = connection.send_messages([message])
    except _SMTP_REFUSED as exc:
        return SendResult.failed(f"refused by mail server: {type(exc).__name__}: {exc}"[:2000])
    except Exception as exc:
        # Disconnected or timed out after the message was handed over: the server may have it.
        return SendResult.unknown(f"no answer: {type(exc).__name__}: {exc}"[:2000])
    finally:
        try:
            connection.close()
        except Exception:  # closing is not part of the outcome
            logger.warning("closing the mail connection failed", exc_info=True)
    if delivered:
        return SendResult.sent()
    return SendResult.failed("the email backend accepted no message")


_SENDERS = {
    "webhook": webhook_send,
    "email": email_send,
}
