"""The shared fixture set: a team with an owner (alice, admin), a reviewer (bob) and a viewer
(charlie), an outsider from another team (mallory), and agent and reviewer tokens."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model

from runs.actors import Actor
from runs.models import ApiToken, Membership, Role, Team
from runs.tokens import api_token_create, team_ensure

User = get_user_model()


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
