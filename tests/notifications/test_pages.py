"""The console's notification pages: channels (admins), deliveries, the demo outbox, and
everyone's own subscriptions. Secrets are shown once and never again."""

from __future__ import annotations

import pytest
from django.core import mail as django_mail
from django.test import Client

from notifications import services as notify
from notifications.demo import demo_channels_ensure
from notifications.models import CapturedMail, Delivery, NotificationChannel, UserSubscription
from tests.support.scenarios import stopped_dirty

pytestmark = pytest.mark.django_db


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _create(client: Client, receiver, **fields) -> object:
    data = {
        "team": "acme",
        "name": "ops",
        "kind": "webhook",
        "target": receiver.url(),
        "events": ["run.stopped_dirty", "approval.waiting"],
        "agent_glob": "",
        **fields,
    }
    return client.post("/notifications/", data)


def test_an_admin_creates_a_webhook_and_sees_its_secret_once(alice, receiver):
    client = _client(alice)
    response = _create(client, receiver)
    assert response.status_code == 200
    channel = NotificationChannel.objects.get()
    assert channel.secret.startswith("whsec_")
    assert channel.secret in response.content.decode()
    assert channel.events == ["approval.waiting", "run.stopped_dirty"]
    for page in ("/notifications/", f"/notifications/channels/{channel.pk}/"):
        assert channel.secret not in client.get(page).content.decode()
    admin_page = _client_staff().get(
        f"/admin/notifications/notificationchannel/{channel.pk}/change/"
    )
    assert admin_page.status_code == 200 and channel.secret not in admin_page.content.decode()


def _client_staff() -> Client:
    from django.contrib.auth import get_user_model

    root = get_user_model().objects.create_superuser("root", password="pw")
    return _client(root)


def test_a_slack_url_is_never_shown_back(alice, receiver):
    client = _client(alice)
    token_url = receiver.url("/services/T0/B0/tokentoken")
    _create(client, receiver, kind="slack", target=token_url)
    channel = NotificationChannel.objects.get()
    for page in ("/notifications/", f"/notifications/channels/{channel.pk}/"):
        assert "tokentoken" not in client.get(page).content.decode()
    # Saving the edit form with the target left blank keeps the URL.
    response = client.post(
        f"/notifications/channels/{channel.pk}/",
        {"name": "ops slack", "target": "", "events": ["run.stopped_dirty"], "enabled": "on"},
    )
    assert response.status_code == 302
    channel.refresh_from_db()
    assert channel.target == token_url and channel.name == "ops slack"


def test_a_target_off_the_allow_list_is_refused_on_the_page(alice, receiver):
    response = _create(_client(alice), receiver, target="https://evil.example/hook")
    assert response.status_code == 400
    assert "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in response.content.decode()
    assert not NotificationChannel.objects.exists()
    # said at the Target field, naming the host and the setting that would allow it
    form = response.context["form"]
    assert list(form.errors) == ["target"]
    assert "evil.example" in form.errors["target"][0]
    assert "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in form.errors["target"][0]


def test_send_test_redirects_then_shows_the_targets_answer(alice, team, receiver, make_channel):
    channel, secret = make_channel(team, receiver.url())
    receiver.secret = secret
    receiver.answers = [(202, "queued by receiver")]
    client = _client(alice)
    response = client.post(f"/notifications/channels/{channel.pk}/test/")
    assert response.status_code == 302
    assert response["Location"].startswith("/notifications/?tested=")
    body = client.get(response["Location"]).content.decode()
    assert "delivered" in body and "HTTP 202" in body and "queued by receiver" in body
    assert receiver.hits[0].verified
    assert secret not in body
    # a reload shows the answer again and sends nothing
    client.get(response["Location"])
    assert len(receiver.hits) == 1


def test_a_test_answer_of_another_teams_channel_is_not_shown(
    alice, outsider, team, receiver, make_channel
):
    channel, _secret = make_channel(team, receiver.url())
    location = _client(alice).post(f"/notifications/channels/{channel.pk}/test/")["Location"]
    body = _client(outsider).get(location)
    assert body.status_code in (200, 302)
    assert "queued" not in body.content.decode() and 'id="test-answer"' not in (
        body.content.decode()
    )


def test_reviewers_and_viewers_manage_only_their_own_subscriptions(
    bob, charlie, team, receiver, make_channel
):
    channel, _ = make_channel(team, receiver.url())
    client = _client(charlie)
    response = client.get("/notifications/")
    assert response.status_code == 302 and response["Location"] == "/notifications/subscriptions/"
    assert client.post(f"/notifications/channels/{channel.pk}/test/").status_code == 403
    assert client.post(f"/notifications/channels/{channel.pk}/delete/").status_code == 403
    assert client.get("/notifications/deliveries/").status_code == 403
    assert NotificationChannel.objects.filter(pk=channel.pk).exists()
    assert receiver.hits == []


def test_an_outsider_cannot_see_another_teams_channel(outsider, team, receiver, make_channel):
    channel, _ = make_channel(team, receiver.url())
    client = _client(outsider)
    assert client.get(f"/notifications/channels/{channel.pk}/").status_code == 404
    assert client.post(f"/notifications/channels/{channel.pk}/delete/").status_code == 404
    assert f'data-channel-id="{channel.pk}"' not in client.get("/notifications/").content.decode()


def test_a_user_subscribes_on_the_page(charlie, team):
    charlie.email = "charlie@example.com"
    charlie.save()
    client = _client(charlie)
    response = client.post(
        "/notifications/subscriptions/",
        {"team": "acme", "events": ["handoff.waiting"], "agent_glob": "report-*"},
    )
    assert response.status_code == 302
    subscription = UserSubscription.objects.get(user=charlie)
    assert (subscription.events, subscription.agent_glob) == (["handoff.waiting"], "report-*")
    page = client.get("/notifications/subscriptions/").content.decode()
    assert 'value="handoff.waiting" checked' in page


def test_a_user_without_an_address_cannot_subscribe(charlie, team):
    response = _client(charlie).post(
        "/notifications/subscriptions/", {"team": "acme", "events": ["handoff.waiting"]}
    )
    assert response.status_code == 302
    assert not UserSubscription.objects.exists()


def test_the_deliveries_page_shows_status_and_the_answer(
    alice, team, receiver, make_channel, django_assert_max_num_queries
):
    make_channel(team, receiver.url())
    receiver.answers = [(500, "receiver exploded")] * 3
    for _ in range(3):
        stopped_dirty(team)
    notify.deliveries_send_due(limit=10, sender="t")
    client = _client(alice)
    with django_assert_max_num_queries(12):
        body = client.get("/notifications/deliveries/").content.decode()
    assert body.count("receiver exploded") == 3 and "HTTP 500" in body
    assert "Run stopped dirty" in body


def test_the_demo_mail_channel_lands_in_the_outbox_page(alice, team, settings):
    settings.EMAIL_BACKEND = "notifications.mail.CaptureEmailBackend"
    assert demo_channels_ensure(["acme"]) == 1
    assert demo_channels_ensure(["acme"]) == 0
    run = stopped_dirty(team)
    notify.deliveries_send_due(limit=10, sender="t")
    captured = CapturedMail.objects.get()
    assert captured.to == ["acme-oncall@example.com"] and run.pk in captured.text
    assert "<a href=" in captured.html
    client = _client(alice)
    page = client.get("/notifications/outbox/").content.decode()
    assert captured.subject in page
    assert "Outbox of notifications" in client.get("/notifications/").content.decode()
    assert Delivery.objects.get().status == "sent"
    assert django_mail.outbox == []


def test_the_nav_links_the_notifications(charlie):
    assert 'href="/notifications/"' in _client(charlie).get("/").content.decode()


def test_every_notifications_model_has_an_admin_page(team, receiver, make_channel):
    from django.apps import apps
    from django.contrib import admin

    make_channel(team, receiver.url())
    stopped_dirty(team)
    client = _client_staff()
    for model in apps.get_app_config("notifications").get_models():
        assert model in admin.site._registry, model.__name__
        url = f"/admin/notifications/{model._meta.model_name}/"
        assert client.get(url).status_code == 200, url
    delivery = Delivery.objects.get()
    page = client.get(f"/admin/notifications/delivery/{delivery.pk}/change/")
    assert page.status_code == 200


def test_the_outbox_page_keeps_agents_mail_apart_from_notifications(alice, team):
    notice = CapturedMail.objects.create(
        from_email="safestop@example.com",
        to=["oncall@example.com"],
        subject="[safestop] Run stopped dirty: nightly report",
        headers={"X-Safestop-Event": "run.stopped_dirty"},
    )
    customer = CapturedMail.objects.create(
        from_email="safestop@example.com",
        to=["customer@example.org"],
        subject="Your refund",
        headers={"X-Safestop-Run": "run_01abc", "Idempotency-Key": "k1"},
    )
    response = _client(alice).get("/notifications/outbox/")
    assert [mail.pk for mail in response.context["mails"]] == [notice.pk]
    assert [mail.pk for mail in response.context["agent_mails"]] == [customer.pk]
    body = response.content.decode()
    agents_part = body[body.index('data-testid="agent-mails"') :]
    assert "Your refund" in agents_part and "Run stopped dirty" not in agents_part
    assert body.index("Run stopped dirty") < body.index('data-testid="agent-mails"')
