"""Every console page, e-mail and Slack payload read in Simplified Chinese shows no English
beyond the fixture's own data and an allow-list of names and code (tests/support/i18n.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import translation

from accounts.services import user_language_set
from gateway.services import upstream_create
from notifications import services as notify
from notifications.models import Delivery
from notifications.transports import Outgoing, slack_blocks
from runs import services
from runs.actors import Actor
from runs.models import Team
from runs.tokens import api_token_create
from tests.support import approvals, scenarios
from tests.support.i18n import english_words, fixture_data_strings, visible_texts
from tests.support.policies import policy

pytestmark = pytest.mark.django_db

ADMIN = Actor.system("test")


@pytest.fixture
def chinese_team(team: Team) -> Team:
    team.time_zone = "Asia/Shanghai"
    team.save(update_fields=["time_zone"])
    return team


@pytest.fixture
def world(
    chinese_team: Team, alice: Any, bob: Any, django_capture_on_commit_callbacks: Any
) -> dict[str, Any]:
    with django_capture_on_commit_callbacks(execute=True):
        return _world(chinese_team, alice, bob)


def _world(chinese_team: Team, alice: Any, bob: Any) -> dict[str, Any]:
    """A team with a run in every state a page shows, approvals, a rule, a channel and a
    subscription that mailed, a token and a bulk stop."""
    team = chinese_team
    alice.email = "alice@example.com"
    alice.save(update_fields=["email"])
    user_language_set(user=alice, language="zh-hans")
    notify.channel_create(
        team=team,
        name="值班邮箱",
        kind="email",
        target="oncall@example.com",
        actor=ADMIN,
        language="zh-hans",
    )
    notify.subscription_set(user=alice, team=team, events=["run.stopped_dirty"])
    running, _lease = scenarios.running(team)
    dirty = scenarios.stopped_dirty(team)
    clean = scenarios.stopped_cleanly(team)
    handed = scenarios.handed_off(team, by=Actor.for_user(bob))
    interrupted = scenarios.interrupted(team, outbox_in_flight=True)
    scenarios.completed(team)
    waiting = approvals.waiting(team)
    decided = approvals.waiting(team, summary="退款订单 1043")
    services.approval_decide(
        approval_id=decided.pk,
        actor=Actor.for_user(bob),
        decision="reject",
        message="金额不对",
    )
    rule = approvals.rule(team, "付款需要人工", tool_glob="payments.*")
    api_token_create(team_slug=team.slug, name="report-bot-prod", role="agent")
    watch = policy(team, "大额退款", "call.arguments.amount > 500", action="require_approval")
    upstream = upstream_create(
        team=team,
        name="everything",
        transport="stdio",
        command="npx",
        args=["@modelcontextprotocol/server-everything", "stdio"],
        env={"API_KEY": "never-shown"},
        actor=ADMIN,
    )
    notify.deliveries_send_due()
    return {
        "team": team,
        "runs": [running, dirty, clean, handed, interrupted],
        "dirty": dirty,
        "interrupted": interrupted,
        "waiting": waiting,
        "decided": decided,
        "rule": rule,
        "channel": team.notification_channels.get(),
        "policy": watch,
        "upstream": upstream,
    }


def _pages(world: dict[str, Any]) -> list[str]:
    team = world["team"]
    return [
        reverse("console:runs"),
        reverse("console:needs_me"),
        *[reverse("console:run", args=[run.pk]) for run in world["runs"]],
        reverse("console:packet_latest", args=[world["dirty"].pk]),
        reverse("console:packet_latest", args=[world["interrupted"].pk]),
        reverse("console:approvals"),
        reverse("console:approval", args=[world["waiting"].public_id]),
        reverse("console:approval", args=[world["decided"].public_id]),
        reverse("console:approval_rules"),
        reverse("console:approval_rule", args=[world["rule"].pk]),
        reverse("console:handoffs"),
        reverse("console:quality"),
        reverse("console:audit"),
        reverse("console:tokens"),
        reverse("console:notifications"),
        reverse("console:notification_channel", args=[world["channel"].pk]),
        reverse("console:notification_subscriptions"),
        reverse("console:notification_deliveries"),
        reverse("console:notification_outbox"),
        reverse("console:policies"),
        reverse("console:policy", args=[world["policy"].pk]),
        reverse("console:team_budget"),
        reverse("console:mcp_upstreams"),
        reverse("console:mcp_upstream", args=[world["upstream"].pk]),
        f"{reverse('console:needs_me')}?kind=approval",
        f"{reverse('console:runs')}?team={team.slug}&status=stopped_dirty",
        "/no-such-page/",
    ]


def _chinese_client(user: Any) -> Client:
    client = Client(HTTP_ACCEPT_LANGUAGE="en-US,en;q=0.9")  # the user's own choice must win
    client.force_login(user)
    return client


def test_every_console_page_reads_in_chinese(world: dict[str, Any], alice: Any) -> None:
    client = _chinese_client(alice)
    data = fixture_data_strings()
    leftovers: dict[str, list[str]] = {}
    for url in _pages(world):
        response = client.get(url, follow=True)
        assert response.status_code in (200, 404), (url, response.status_code)
        html = response.content.decode()
        assert '<html lang="zh-Hans">' in html, url
        words = english_words(visible_texts(html), data)
        if words:
            leftovers[url] = words
    assert leftovers == {}, json.dumps(leftovers, ensure_ascii=False, indent=1)


def test_the_sign_in_page_follows_accept_language(db: None) -> None:
    for header in ("zh-CN,zh;q=0.9,en;q=0.5", "zh", "zh-Hans"):
        html = Client(HTTP_ACCEPT_LANGUAGE=header).get(reverse("console:login")).content.decode()
        assert '<html lang="zh-Hans">' in html, header
        assert english_words(visible_texts(html)) == [], header
    english = Client(HTTP_ACCEPT_LANGUAGE="en-US").get(reverse("console:login")).content.decode()
    assert '<html lang="en">' in english and "Sign in" in english


def test_the_mails_are_written_in_their_recipients_language(
    world: dict[str, Any], mailoutbox: list[Any]
) -> None:
    assert {address for mail in mailoutbox for address in mail.to} >= {
        "oncall@example.com",
        "alice@example.com",
    }
    data = fixture_data_strings()
    for mail in mailoutbox:
        html = mail.alternatives[0][0]
        texts = [mail.subject, *mail.body.splitlines(), *visible_texts(html)]
        assert english_words(texts, data) == [], mail.subject
        assert '<html lang="zh-Hans">' in html
    subjects = " ".join(mail.subject for mail in mailoutbox)
    assert "未干净停止" in subjects and "审批" in subjects


def _slack_texts(value: Any) -> Any:
    """Every text object's words in a Block Kit payload (headers, sections, fields, buttons)."""
    if isinstance(value, dict):
        if value.get("type") in ("plain_text", "mrkdwn") and isinstance(value.get("text"), str):
            yield value["text"]
        for item in value.values():
            yield from _slack_texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _slack_texts(item)


def test_the_slack_payload_reads_in_chinese(world: dict[str, Any]) -> None:
    delivery = Delivery.objects.filter(channel__isnull=False, event="run.stopped_dirty").first()
    assert delivery is not None and delivery.message["language"] == "zh-hans"
    outgoing = Outgoing(
        id=delivery.public_id,
        event=delivery.event,
        message=delivery.message,
        created_at=delivery.created_at,
    )
    with translation.override("zh-hans"):
        blocks = slack_blocks(outgoing.message)
    texts = list(_slack_texts(blocks))
    assert any("停止报告" in text for text in texts)
    assert english_words(texts, fixture_data_strings()) == []
