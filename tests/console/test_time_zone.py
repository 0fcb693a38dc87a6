"""The team's time zone applies from the next request after an admin changes it, not from the
next sign-in, and reading it costs no query per request."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.services import user_time_zone_cached
from runs.models import Membership, Role, Team
from tests.support import scenarios

pytestmark = pytest.mark.django_db


def _run_page(client: Client, run_id: str) -> str:
    return client.get(reverse("console:run", args=[run_id])).content.decode()


def test_a_changed_team_time_zone_shows_on_the_next_request(team: Team, alice: Any) -> None:
    run = scenarios.stopped_cleanly(team)
    client = Client()
    client.force_login(alice)
    assert "UTC+08:00" not in _run_page(client, run.pk)
    team.time_zone = "Asia/Shanghai"
    team.save()  # as the Django admin's change form saves it
    assert "UTC+08:00" in _run_page(client, run.pk)
    team.time_zone = "UTC"
    team.save(update_fields=["time_zone"])
    assert "UTC+08:00" not in _run_page(client, run.pk)


def test_a_membership_change_brings_the_new_first_teams_zone(team: Team, alice: Any) -> None:
    later = Team.objects.create(slug="shanghai", name="Shanghai", time_zone="Asia/Shanghai")
    Membership.objects.create(user=alice, team=later, role=Role.ADMIN)
    run = scenarios.stopped_cleanly(later)
    client = Client()
    client.force_login(alice)
    assert "UTC+08:00" not in _run_page(client, run.pk)  # her first team is still `team` (UTC)
    Membership.objects.filter(user=alice, team=team).delete()
    assert "UTC+08:00" in _run_page(client, run.pk)


def test_the_zone_is_read_once_then_from_the_cache(
    team: Team, alice: Any, django_assert_num_queries: Any
) -> None:
    team.time_zone = "Asia/Shanghai"
    team.save(update_fields=["time_zone"])
    assert user_time_zone_cached(user=alice) == "Asia/Shanghai"
    with django_assert_num_queries(0):
        assert user_time_zone_cached(user=alice) == "Asia/Shanghai"
    team.save(update_fields=["name"])  # a save that leaves the zone alone forgets nothing
    with django_assert_num_queries(0):
        assert user_time_zone_cached(user=alice) == "Asia/Shanghai"
