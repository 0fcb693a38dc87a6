"""Shared fixtures: a team with an owner (admin), a reviewer and a viewer, an outsider from
another team, and agent and reviewer tokens. The suite runs on PostgreSQL (`make test`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model

from runs.actors import Actor
from runs.models import ApiToken, Membership, Role, Team
from runs.tokens import api_token_create, team_ensure

User = get_user_model()


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine and not os.environ.get("SAFESTOP_ALLOW_SQLITE_TESTS"):
        raise pytest.UsageError(
            "the suite runs on PostgreSQL: use `make test`, or set "
            "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
        )


@pytest.fixture
def team(db: None) -> Team:
    return team_ensure(slug="acme", name="Acme")


@pytest.fixture
def other_team(db: None) -> Team:
    return team_ensure(slug="globex", name="Globex")


def _member(username: str, team: Team, role: str, *, staff: bool = False):
    user = User.objects.create_user(username=username, password="pw-" + username, is_staff=staff)
    Membership.objects.create(user=user, team=team, role=role)
    return user


@pytest.fixture
def alice(team: Team):
    """Team admin (owner)."""
    return _member("alice", team, Role.ADMIN)


@pytest.fixture
def bob(team: Team):
    """Reviewer."""
    return _member("bob", team, Role.REVIEWER)


@pytest.fixture
def charlie(team: Team):
    """Viewer."""
    return _member("charlie", team, Role.VIEWER)


@pytest.fixture
def outsider(other_team: Team):
    return _member("mallory", other_team, Role.ADMIN)


@dataclass
class IssuedToken:
    token: ApiToken
    raw: str

    @property
    def header(self) -> dict[str, str]:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.raw}"}


@pytest.fixture
def agent_token(team: Team) -> IssuedToken:
    token, raw = api_token_create(team_slug=team.slug, name="agent-1", role="agent")
    return IssuedToken(token, raw)


@pytest.fixture
def reviewer_token(team: Team) -> IssuedToken:
    token, raw = api_token_create(team_slug=team.slug, name="reviewer-bot", role="reviewer")
    return IssuedToken(token, raw)


@pytest.fixture
def outsider_token(other_team: Team) -> IssuedToken:
    token, raw = api_token_create(team_slug=other_team.slug, name="globex-agent", role="agent")
    return IssuedToken(token, raw)


@pytest.fixture
def system() -> Actor:
    return Actor.system("test")


@pytest.fixture
def reviewer_actor(bob) -> Actor:
    return Actor.for_user(bob)
