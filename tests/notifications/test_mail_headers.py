"""A line break in an agent's words (a tool name, a run title, an outbox subject) can neither
inject a mail header nor silence the mail: header values are cleaned where they are made, and a
message that can never be built fails at once with its reason. Real SMTP (aiosmtpd)."""

from __future__ import annotations

import pytest

from notifications import services as notify
from notifications.models import CapturedMail, Delivery
from runs import services
from runs.transports import email_send, header_value
from tests.support.scenarios import AGENT, new_run, start, stopped_dirty

pytestmark = pytest.mark.django_db


def _send_all() -> int:
    return notify.deliveries_send_due(limit=20, sender="test-sender")


def test_a_newline_in_a_tool_name_still_mails_the_approval(team, smtp_server, make_channel):
    make_channel(team, "oncall@example.com", kind="email", events=["approval.waiting"])
    run = new_run(team)
    start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="c1",
        tool="payments.charge\r\nBcc: thief@evil.test",
        side_effect="write",
        actor=AGENT,
        needs_approval=True,
    )
    assert _send_all() == 1
    [envelope] = smtp_server.envelopes
    assert envelope.rcpt_tos == ["oncall@example.com"]
    [mail] = smtp_server.messages()
    assert mail["Subject"] == "[safestop] Approval waiting: payments.charge Bcc: thief@evil.test"
    assert mail["Bcc"] is None
    assert Delivery.objects.get().status == "sent"


def test_a_newline_in_a_run_title_is_cleaned_in_the_demo_outbox_too(team, make_channel, settings):
    settings.EMAIL_BACKEND = "notifications.mail.CaptureEmailBackend"
    make_channel(team, "oncall@example.com", kind="email")
    stopped_dirty(team, title="Quarterly\nreport\u2028X-Evil: 1")
    assert _send_all() == 1
    captured = CapturedMail.objects.get()
    assert captured.subject == "[safestop] Run stopped dirty: Quarterly report X-Evil: 1"


def test_a_message_that_can_never_be_built_fails_at_once_with_its_reason(
    team, smtp_server, make_channel, settings
):
    settings.DEFAULT_FROM_EMAIL = "safestop@example.com\nBcc: thief@evil.test"
    make_channel(team, "oncall@example.com", kind="email")
    stopped_dirty(team)
    _send_all()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("failed", 1)
    assert "cannot be built" in delivery.last_error
    assert smtp_server.envelopes == []


def test_an_outbox_mail_subject_with_a_newline_is_sent_not_unknown(smtp_server):
    result = email_send(
        destination="customer@example.com",
        payload={"subject": "Your invoice\r\nBcc: thief@evil.test", "body": "Hello"},
        idempotency_key="k1",
        run_id="run_1",
    )
    assert result.outcome == "sent"
    [mail] = smtp_server.messages()
    assert mail["Subject"] == "Your invoice Bcc: thief@evil.test" and mail["Bcc"] is None
    assert smtp_server.envelopes[0].rcpt_tos == ["customer@example.com"]


def test_header_value_keeps_words_and_drops_every_line_break():
    assert header_value("a\r\nb\tc\x00d\x85e\u2029f") == "a b c d e f"
    assert header_value("x" * 400) == "x" * 250
