"""How a notification leaves: signed webhook, Slack, email, or an Apprise URL.

A transport never raises, never touches the database and is called outside any transaction
(by the sender, after the event committed). It answers whether the target took it, whether
another attempt is worth making, the HTTP status if any, and the first bytes of the answer.

Unlike an outbox item, a notification may be sent twice (a retry after a lost answer): every
attempt carries the same id (`webhook-id`, `Message-ID`) so a receiver can drop a repeat.
Every kind that posts over HTTP obeys the outbox's allow-list, is never redirected and always
verifies TLS (`runs.services.validate_outbox_destination`, checked at save and again at every
send; Apprise URLs through `notifications.apprise_targets`); proxies from the environment are
ignored. Nothing here logs a target or a secret: Slack and Apprise URLs carry
their service's token.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import smtplib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection
from django.core.serializers.json import DjangoJSONEncoder
from django.template.loader import render_to_string
from django.utils import translation
from django.utils.translation import gettext
from standardwebhooks.webhooks import Webhook

from notifications.apprise_targets import ALLOW_LIST, apprise_guarded, apprise_refusal
from runs.errors import InvalidInput
from runs.services import validate_outbox_destination
from runs.transports import header_value, webhook_timeout

logger = logging.getLogger(__name__)

USER_AGENT = "safestop-notifications/1"
EXCERPT_BYTES = 300


@dataclass(frozen=True, slots=True)
class Answer:
    ok: bool
    retry: bool = False  # worth another attempt later (no answer, 5xx, 429, 408)
    status: int | None = None
    excerpt: str = ""  # the first bytes of the answer (or of the error)
    error: str = ""

    @classmethod
    def refused(cls, error: str, status: int | None = None, excerpt: str = "") -> Answer:
        return cls(False, False, status, excerpt or error[:EXCERPT_BYTES], error)

    @classmethod
    def later(cls, error: str, status: int | None = None, excerpt: str = "") -> Answer:
        return cls(False, True, status, excerpt or error[:EXCERPT_BYTES], error)


@dataclass(frozen=True)
class Outgoing:
    """One send: the delivery's stable id, the event and the message (notifications.events)."""

    id: str
    event: str
    message: dict[str, Any]
    created_at: datetime


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: `whsec_` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _webhook_refusal(target: str) -> str:
    """Why a webhook or Slack target is refused, said at the Target field: which setting would
    allow its host, or what is wrong with the URL itself."""
    try:
        parts = urlsplit(target)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return gettext("not a valid URL")
    if parts.scheme not in ("http", "https") or not host:
        return gettext("the target must be an http:// or https:// URL")
    if any(char in target for char in "\r\n\t\x00 "):
        return gettext("the URL may not contain spaces or line breaks")
    shown = f"{host}:{port}" if port else host
    return gettext(
        "%(host)s is not an allowed destination: add it to SAFESTOP_WEBHOOK_ALLOWED_HOSTS "
        "(the server's setting that lists the hosts webhooks may reach)"
    ) % {"host": shown}


def validate_target(kind: str, target: str) -> None:
    """Refuse a target that could never be sent to (raises `InvalidInput`)."""
    if kind in ("webhook", "slack"):
        try:
            validate_outbox_destination("webhook", target)
        except InvalidInput:
            raise InvalidInput(_webhook_refusal(target), field="target") from None
    elif kind == "email":
        try:
            validate_outbox_destination("email", target)
        except InvalidInput as error:
            raise InvalidInput(error.detail, field="target") from None
    elif kind == "apprise":
        refusal = apprise_refusal(target, schemes=settings.SAFESTOP_NOTIFY_APPRISE_SCHEMES)
        if refusal is not None:
            raise InvalidInput(refusal, field="target")
    else:
        raise InvalidInput(gettext("kind must be webhook, slack, email or apprise"), field="kind")


def mask_target(kind: str, target: str) -> str:
    """A target as pages show it: Slack and Apprise URLs (and webhook query strings) carry
    tokens, so only where it goes is shown, never the credential."""
    if kind == "email":
        return target
    parts = urlsplit(target)
    if kind == "webhook":
        return f"{parts.scheme}://{parts.netloc}{parts.path}" + ("?…" if parts.query else "")
    if kind == "slack":
        return f"{parts.scheme}://{parts.hostname or ''}/…"
    return f"{parts.scheme}://…"


def send(*, kind: str, target: str, secret: str, outgoing: Outgoing) -> Answer:
    sender = _SENDERS.get(kind)
    if sender is None:
        return Answer.refused(gettext("no channel kind %(repr)s") % {"repr": repr(kind)})
    try:
        # The message was written in its recipient's language (`message["language"]`): the
        # words the e-mail and the Slack buttons add follow it.
        with translation.override(outgoing.message.get("language") or settings.LANGUAGE_CODE):
            return sender(target, secret, outgoing)
    except Exception as exc:  # a bug here must not kill the sender loop; the next try may work
        logger.exception("notification transport %s crashed on %s", kind, outgoing.id)
        return Answer.later(gettext("transport crashed: %(name)s") % {"name": type(exc).__name__})


# --------------------------------------------------------------------------------------------
# HTTP (webhook, Slack)


def _post(url: str, body: bytes, headers: dict[str, str]) -> Answer:
    try:
        validate_outbox_destination("webhook", url)
    except InvalidInput as refused:
        return Answer.refused(gettext("not sent: %(detail)s") % {"detail": refused.detail})
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, **headers}
    try:
        with httpx.Client(
            timeout=webhook_timeout(), follow_redirects=False, trust_env=False
        ) as client:
            response = client.post(url, content=body, headers=headers)
    except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError) as exc:
        return Answer.refused(gettext("not sent: %(name)s") % {"name": type(exc).__name__})
    except httpx.TransportError as exc:
        # Refused, timed out or dropped: the target may come back, so try again later. The
        # exception text is left out on purpose: it can quote the URL (a Slack token).
        return Answer.later(gettext("no answer: %(name)s") % {"name": type(exc).__name__})
    status = response.status_code
    excerpt = response.text[:EXCERPT_BYTES]
    if 200 <= status < 300:
        return Answer(True, False, status, excerpt)
    if 300 <= status < 400:
        return Answer.refused(
            gettext("HTTP %(status)s: redirect not followed") % {"status": status}, status, excerpt
        )
    if status in (408, 425, 429) or status >= 500:
        return Answer.later(f"HTTP {status}", status, excerpt)
    return Answer.refused(f"HTTP {status}", status, excerpt)


def webhook_body(outgoing: Outgoing) -> bytes:
    """The Standard Webhooks payload shape: type, timestamp, data."""
    return json.dumps(
        {
            "type": outgoing.event,
            "timestamp": outgoing.created_at.isoformat(),
            "data": outgoing.message,
        },
        cls=DjangoJSONEncoder,
        separators=(",", ":"),
    ).encode()


def _webhook(target: str, secret: str, outgoing: Outgoing) -> Answer:
    if not secret:
        return Answer.refused(gettext("the channel has no signing secret"))
    body = webhook_body(outgoing)
    # Signed at each attempt with the attempt's time: a receiver refuses stale timestamps.
    now = datetime.now(tz=UTC)
    signature = Webhook(secret).sign(msg_id=outgoing.id, timestamp=now, data=body.decode())
    headers = {
        "webhook-id": outgoing.id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }
    return _post(target, body, headers)


def slack_escape(text: str) -> str:
    """Slack's three control characters in mrkdwn and plain text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_blocks(
    message: dict[str, Any], *, actions: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """A Block Kit message: the title, what to do, the facts, a button to the console page."""
    from slack_sdk.models.blocks import (
        ActionsBlock,
        ButtonElement,
        HeaderBlock,
        MarkdownTextObject,
        SectionBlock,
    )

    facts = [
        MarkdownTextObject(text=f"*{slack_escape(str(label))}*\n{slack_escape(str(value))[:1900]}")
        for label, value in message.get("facts", [])[:10]
    ]
    blocks: list[Any] = [
        HeaderBlock(text=str(message.get("title", "safestop"))[:150]),
        SectionBlock(
            text=MarkdownTextObject(text=slack_escape(str(message.get("text", "")))[:3000])
        ),
    ]
    if facts:
        blocks.append(SectionBlock(fields=facts))
    elements: list[Any] = [
        ButtonElement(
            text=str(message.get("link_label") or gettext("Open in safestop"))[:75],
            url=str(message.get("link", "")),
            action_id="open_console",
        )
    ]
    rendered = [block.to_dict() for block in blocks]
    buttons = ActionsBlock(elements=elements).to_dict()
    buttons["elements"].extend(actions or [])
    rendered.append(buttons)
    return rendered


def _slack(target: str, secret: str, outgoing: Outgoing) -> Answer:
    message = outgoing.message
    body = json.dumps(
        {
            # The notification's own text is mrkdwn too: the title carries the agent's words.
            "text": slack_escape(f"{message.get('title', '')}: {message.get('link', '')}"),
            "blocks": slack_blocks(message, actions=slack_actions(outgoing)),
        }
    ).encode()
    return _post(target, body, {})


def slack_actions(outgoing: Outgoing) -> list[dict[str, Any]]:
    """Approve / Reject buttons on a waiting approval, when Slack interactivity is configured
    (`SAFESTOP_SLACK_SIGNING_SECRET`); the click is verified and decided by
    `notifications.slack` with the clicking user's rights."""
    approval_id = outgoing.message.get("approval_id")
    if not (settings.SAFESTOP_SLACK_SIGNING_SECRET and approval_id):
        return []
    if outgoing.event not in ("approval.waiting", "approval.escalated"):
        return []
    return [
        {
            "type": "button",
            "action_id": "approve",
            "style": "primary",
            "text": {"type": "plain_text", "text": gettext("Approve")},
            "value": str(approval_id),
        },
        {
            "type": "button",
            "action_id": "reject",
            "style": "danger",
            "text": {"type": "plain_text", "text": gettext("Reject")},
            "value": str(approval_id),
        },
    ]


# --------------------------------------------------------------------------------------------
# email

_SMTP_REFUSED = (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused)


def email_message(target: str, outgoing: Outgoing) -> EmailMultiAlternatives:
    context = {"message": outgoing.message, "event": outgoing.event}
    text = render_to_string("notifications/email.txt", context)
    html = render_to_string("notifications/email.html", context)
    domain = settings.DEFAULT_FROM_EMAIL.rpartition("@")[2] or "safestop"
    mail = EmailMultiAlternatives(
        subject=header_value(f"[safestop] {outgoing.message.get('title', outgoing.event)}"),
        body=text,
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[target],
        headers={
            # The same id on every attempt, so a mailbox can tell a retry from a new event.
            "Message-ID": f"<{outgoing.id}@{domain}>",
            "X-Safestop-Event": header_value(outgoing.event),
        },
    )
    mail.attach_alternative(html, "text/html")
    return mail


def _email(target: str, secret: str, outgoing: Outgoing) -> Answer:
    try:
        validate_outbox_destination("email", target)
    except InvalidInput as refused:
        return Answer.refused(gettext("not sent: %(detail)s") % {"detail": refused.detail})
    try:
        mail = email_message(target, outgoing)
        mail.message()  # built here, so a message that can never be built is not retried
    except ValueError as exc:  # BadHeaderError, a malformed address
        return Answer.refused(f"not sent: the message cannot be built: {exc}"[:500])
    connection = get_connection(fail_silently=False)  # EMAIL_TIMEOUT bounds every SMTP call
    try:
        connection.send_messages([mail])
    except _SMTP_REFUSED as exc:
        return Answer.refused(f"refused by the mail server: {type(exc).__name__}: {exc}"[:500])
    except (smtplib.SMTPException, OSError) as exc:
        return Answer.later(f"mail server: {type(exc).__name__}: {exc}"[:500])
    return Answer(True, False, None, gettext("accepted by the mail backend"))


# --------------------------------------------------------------------------------------------
# Apprise (Teams, Discord, Telegram, …)


def _apprise(target: str, secret: str, outgoing: Outgoing) -> Answer:
    # Checked again at every send: the allow-list or the schemes may have shrunk since.
    refusal = apprise_refusal(target, schemes=settings.SAFESTOP_NOTIFY_APPRISE_SCHEMES)
    if refusal is not None:
        return Answer.refused(gettext("not sent: %(refusal)s") % {"refusal": refusal})
    import apprise

    message = outgoing.message
    body = f"{message.get('text', '')}\n\n{message.get('link_label', 'Open')}: {message.get('link', '')}"
    with apprise_guarded(target) as guarded, apprise.LogCapture(level=logging.WARNING) as captured:
        if guarded is None:
            return Answer.refused(gettext("Apprise does not understand this URL"))
        ok = bool(
            guarded.notifier.notify(
                title=str(message.get("title", ""))[:250],
                body=body,
                body_format=apprise.NotifyFormat.TEXT,
            )
        )
        log = captured.getvalue()
    # Apprise's own log lines may quote the URL: its token never reaches the excerpt.
    excerpt = log.replace(target, mask_target("apprise", target))[:EXCERPT_BYTES]
    if guarded.refused:
        hosts = ", ".join(sorted(set(guarded.refused)))
        return Answer.refused(
            gettext("not sent: Apprise tried to reach %(hosts)s, not on %(ALLOW_LIST)s")
            % {"hosts": hosts, "ALLOW_LIST": ALLOW_LIST}
        )
    if ok:
        return Answer(True, False, None, excerpt or gettext("accepted by Apprise"))
    return Answer.later(gettext("Apprise could not deliver"), excerpt=excerpt)


_SENDERS = {
    "webhook": _webhook,
    "slack": _slack,
    "email": _email,
    "apprise": _apprise,
}
