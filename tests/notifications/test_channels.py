"""Each channel kind against a real target: SMTP (aiosmtpd), Slack's incoming-webhook shape and
an Apprise target, all on 127.0.0.1; users' own email subscriptions."""

from __future__ import annotations

import json
import logging

import pytest
from django.contrib.auth import get_user_model

from notifications import services as notify
from notifications.models import Delivery, UserSubscription
from runs.errors import InvalidInput
from runs.models import Membership, Role
from tests.support.scenarios import new_run, start, stopped_dirty

pytestmark = pytest.mark.django_db


def _send_all() -> int:
    return notify.deliveries_send_due(limit=100, sender="test-sender")


# --------------------------------------------------------------------------------------------
# email


def test_an_email_channel_mails_text_and_html_through_smtp(team, smtp_server, make_channel):
    make_channel(team, "oncall@example.com", kind="email")
    run = stopped_dirty(team)
    assert _send_all() == 1
    [envelope] = smtp_server.envelopes
    assert envelope.rcpt_tos == ["oncall@example.com"]
    [mail] = smtp_server.messages()
    assert mail["Subject"] == f"[safestop] Run stopped dirty: {run.title}"
    assert mail["Message-ID"] == f"<{Delivery.objects.get().public_id}@localhost>"
    text = mail.get_body(preferencelist=("plain",)).get_content()
    html = mail.get_body(preferencelist=("html",)).get_content()
    link = f"http://127.0.0.1:8000/runs/{run.pk}/packet/"
    assert "resolve each unknown" in text and link in text
    assert f'href="{link}"' in html
    assert Delivery.objects.get().status == "sent"


def test_a_mail_server_that_is_down_is_retried_later(team, settings, make_channel):
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", 9, 1
    make_channel(team, "oncall@example.com", kind="email")
    stopped_dirty(team)
    _send_all()
    delivery = Delivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert "ConnectionRefused" in delivery.last_error


def test_a_user_subscribes_to_their_team_by_email(team, bob, smtp_server, other_team):
    bob.email = "bob@example.com"
    bob.save()
    notify.subscription_set(user=bob, team=team, events=["run.stopped_dirty"])
    stopped_dirty(team)
    assert _send_all() == 1
    assert smtp_server.envelopes[0].rcpt_tos == ["bob@example.com"]

    Membership.objects.filter(user=bob).delete()  # bob left the team: nothing more for him
    stopped_dirty(team)
    assert Delivery.objects.count() == 1


def test_no_events_removes_a_subscription(team, bob):
    notify.subscription_set(user=bob, team=team, events=["approval.waiting"])
    assert notify.subscription_set(user=bob, team=team, events=[]) is None
    assert not UserSubscription.objects.exists()


# --------------------------------------------------------------------------------------------
# Slack


def test_slack_gets_a_block_kit_message_with_a_button_to_the_console(team, receiver, make_channel):
    make_channel(team, receiver.url("/services/T0/B0/token"), kind="slack")
    run = stopped_dirty(team, title="Pay <vendors> & co")
    assert _send_all() == 1
    body = json.loads(receiver.hits[0].body)
    blocks = body["blocks"]
    assert blocks[0]["type"] == "header"
    assert blocks[0]["text"]["text"] == "Run stopped dirty: Pay <vendors> & co"  # plain text
    assert "resolve each unknown" in blocks[1]["text"]["text"]
    facts = " ".join(field["text"] for field in blocks[2]["fields"])
    assert "Pay &lt;vendors&gt; &amp; co" in facts  # Slack's control characters escaped
    [button] = blocks[-1]["elements"]
    assert button["url"] == f"http://127.0.0.1:8000/runs/{run.pk}/packet/"
    assert "webhook-signature" not in receiver.hits[0].headers


def test_a_slack_url_is_a_credential_kept_out_of_logs_and_pages(
    team, receiver, make_channel, caplog
):
    caplog.set_level(logging.DEBUG)
    channel, secret = make_channel(team, receiver.url("/services/T0/B0/xoxsecret42"), kind="slack")
    assert secret == ""  # nothing to sign with: the URL itself is the secret
    receiver.answers = [(500, "invalid_token")]
    stopped_dirty(team)
    _send_all()
    assert "xoxsecret42" not in caplog.text
    assert channel.target_display == "http://127.0.0.1/…"
    assert Delivery.objects.get().response_excerpt == "invalid_token"


# --------------------------------------------------------------------------------------------
# Apprise (Teams, Discord, Telegram, … ) — here its generic JSON target on 127.0.0.1


def test_an_apprise_target_receives_the_title_body_and_link(team, receiver, settings, make_channel):
    settings.SAFESTOP_NOTIFY_APPRISE_SCHEMES = ["json"]
    make_channel(team, f"json://{receiver.host}/apprise", kind="apprise")
    run = stopped_dirty(team)
    assert _send_all() == 1
    body = json.loads(receiver.hits[0].body)
    assert body["title"] == f"Run stopped dirty: {run.title}"
    assert f"/runs/{run.pk}/packet/" in body["message"]


def test_apprise_schemes_that_post_anywhere_are_refused(team, make_channel):
    with pytest.raises(InvalidInput, match="Apprise URL"):
        make_channel(team, "json://10.0.0.5/hook", kind="apprise")
    with pytest.raises(InvalidInput, match="ALLOWED_HOSTS"):
        make_channel(team, "https://evil.example/hook", kind="webhook")


# --------------------------------------------------------------------------------------------
# "Send test"


def test_send_test_delivers_a_sample_at_once_and_answers(team, webhook, receiver):
    from runs.actors import Actor

    delivery, answer = notify.channel_send_test(channel_id=webhook.pk, actor=Actor.system("t"))
    assert answer.ok and answer.status == 200
    assert delivery.status == "sent" and delivery.event == "test"
    assert receiver.hits[0].verified


def test_a_failed_test_is_never_retried(team, webhook, receiver):
    from runs.actors import Actor

    receiver.answers = [(503, "maintenance")]
    delivery, answer = notify.channel_send_test(channel_id=webhook.pk, actor=Actor.system("t"))
    assert not answer.ok and answer.excerpt == "maintenance"
    assert delivery.status == "failed"


def test_an_approval_waiting_message_names_the_call_and_its_deadline(team, receiver, make_channel):
    from runs import services
    from tests.support.scenarios import AGENT

    make_channel(team, receiver.url("/services/T/B/x"), kind="slack")
    run = new_run(team)
    start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="c1",
        tool="payments.charge",
        side_effect="write",
        actor=AGENT,
        needs_approval=True,
    )
    _send_all()
    blocks = json.loads(receiver.hits[0].body)["blocks"]
    assert blocks[0]["text"]["text"] == "Approval waiting: payments.charge"
    assert "Expires" in json.dumps(blocks[2])
    assert [e.get("action_id") for e in blocks[-1]["elements"]] == ["open_console"]


def test_users_without_the_team_get_nothing(team, other_team, smtp_server):
    user = get_user_model().objects.create_user("eve", email="eve@example.com")
    Membership.objects.create(user=user, team=other_team, role=Role.ADMIN)
    UserSubscription.objects.create(user=user, team=team, events=["run.stopped_dirty"])
    stopped_dirty(team)
    assert not Delivery.objects.exists()
