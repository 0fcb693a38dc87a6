"""Who chooses the language: the signed-in user's saved choice, else the cookie the sign-in
page's switch sets, else Accept-Language (zh, zh-CN, zh-Hans → Simplified Chinese), else
English; times in the team's time zone; the JavaScript catalog in the reader's language."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import UserSettings
from console.middleware import language_from_accept_header
from runs.models import Team
from tests.support import scenarios

pytestmark = pytest.mark.django_db


def _lang(response: Any) -> str:
    html = response.content.decode()
    return html.split('<html lang="', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize(
    ("header", "language"),
    [
        ("zh-CN,zh;q=0.9,en;q=0.8", "zh-hans"),
        ("zh", "zh-hans"),
        ("zh-Hans", "zh-hans"),
        ("zh-hans-CN", "zh-hans"),
        ("en-US,en;q=0.9,zh-CN;q=0.5", "en"),
        ("fr-FR", None),
        ("", None),
    ],
)
def test_accept_language_tags_map_to_the_console_languages(header: str, language: Any) -> None:
    assert language_from_accept_header(header) == language


def test_english_stays_the_default(db: None) -> None:
    response = Client(HTTP_ACCEPT_LANGUAGE="fr-FR").get(reverse("console:login"))
    assert _lang(response) == "en" and response["Content-Language"] == "en"


def test_the_sign_in_page_switch_sets_a_cookie_that_beats_the_header(db: None) -> None:
    client = Client(HTTP_ACCEPT_LANGUAGE="en-US")
    answer = client.post(reverse("console:language"), {"language": "zh-hans", "next": "/login/"})
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert _lang(client.get(reverse("console:login"))) == "zh-Hans"


def test_a_language_the_console_does_not_speak_is_refused(db: None) -> None:
    answer = Client().post(reverse("console:language"), {"language": "fr"})
    assert answer.status_code == 400


def test_a_foreign_next_is_not_followed(db: None) -> None:
    answer = Client().post(
        reverse("console:language"), {"language": "en", "next": "https://evil.example/"}
    )
    assert answer["Location"] == "/"


def test_the_users_choice_is_saved_and_wins_over_the_header(alice: Any) -> None:
    browser = Client(HTTP_ACCEPT_LANGUAGE="en-US")
    browser.force_login(alice)
    assert _lang(browser.get(reverse("console:runs"))) == "en"
    browser.post(reverse("console:language"), {"language": "zh-hans", "next": "/"})
    assert UserSettings.objects.get(user=alice).language == "zh-hans"
    assert _lang(browser.get(reverse("console:runs"))) == "zh-Hans"
    # another browser, whose header asks for English: the saved choice follows the user
    elsewhere = Client(HTTP_ACCEPT_LANGUAGE="en-US")
    elsewhere.force_login(alice)
    assert _lang(elsewhere.get(reverse("console:runs"))) == "zh-Hans"


def test_times_show_in_the_teams_time_zone(team: Team, alice: Any) -> None:
    team.time_zone = "Asia/Shanghai"
    team.save(update_fields=["time_zone"])
    run = scenarios.stopped_cleanly(team)
    client = Client()
    client.force_login(alice)
    html = client.get(reverse("console:run", args=[run.pk])).content.decode()
    assert "UTC+08:00" in html


def test_a_team_time_zone_must_be_a_real_zone(team: Team) -> None:
    from django.core.exceptions import ValidationError

    team.time_zone = "Mars/Olympus"
    with pytest.raises(ValidationError):
        team.full_clean()


def test_the_javascript_catalog_speaks_the_readers_language(db: None) -> None:
    chinese = Client(HTTP_ACCEPT_LANGUAGE="zh-CN").get(reverse("console:jsi18n")).content.decode()
    assert "\\u8fd8\\u5269" in chinese or "还剩" in chinese  # "还剩": time left, in the countdown
    english = Client(HTTP_ACCEPT_LANGUAGE="en").get(reverse("console:jsi18n")).content.decode()
    assert "还剩" not in english and "\\u8fd8\\u5269" not in english
