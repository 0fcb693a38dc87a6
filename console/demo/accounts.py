"""Demo teams and users: created by `manage.py demo_setup` only, never by a migration.

Idempotent: running it again changes nothing (a password is only reset when it no longer
matches the demo one, so a second `serve` does not log everybody out).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from runs.models import Membership, Role, Team
from runs.tokens import team_ensure

DEMO_TEAMS: tuple[tuple[str, str], ...] = (("payments", "Payments"), ("platform", "Platform"))


@dataclass(frozen=True)
class DemoUser:
    username: str
    password: str
    role: str
    superuser: bool = False

    @property
    def can(self) -> str:
        return {
            Role.ADMIN: "everything, all teams: audit, tokens, stop quality",
            Role.REVIEWER: "stop, take over, resolve, hand off, steer",
            Role.VIEWER: "read only",
        }[Role(self.role)]


DEMO_USERS: tuple[DemoUser, ...] = (
    DemoUser("admin", "admin-demo", Role.ADMIN, superuser=True),
    DemoUser("reviewer", "reviewer-demo", Role.REVIEWER),
    DemoUser("viewer", "viewer-demo", Role.VIEWER),
)


@dataclass(frozen=True)
class EnsureReport:
    teams_created: int
    users_created: int
    memberships_created: int
    passwords_reset: int


def demo_accounts_ensure() -> EnsureReport:
    """Create (or bring back to the demo state) the demo teams, users and memberships."""
    user_model = get_user_model()
    teams_created = users_created = memberships_created = passwords_reset = 0
    with transaction.atomic():
        teams = []
        for slug, name in DEMO_TEAMS:
            existed = Team.objects.filter(slug=slug).exists()
            teams.append(team_ensure(slug=slug, name=name))
            teams_created += not existed
        for spec in DEMO_USERS:
            user, created = user_model.objects.get_or_create(username=spec.username)
            users_created += created
            changed: list[str] = []
            if created or not user.check_password(spec.password):
                user.set_password(spec.password)
                changed.append("password")
                passwords_reset += not created
            wanted = {"is_active": True, "is_staff": spec.superuser, "is_superuser": spec.superuser}
            for attribute, value in wanted.items():
                if getattr(user, attribute) != value:
                    setattr(user, attribute, value)
                    changed.append(attribute)
            if changed:
                user.save(update_fields=None if created else changed)
            for team in teams:
                membership, made = Membership.objects.get_or_create(
                    user=user, team=team, defaults={"role": spec.role}
                )
                memberships_created += made
                if membership.role != spec.role:
                    membership.role = spec.role
                    membership.save(update_fields=["role"])
    return EnsureReport(teams_created, users_created, memberships_created, passwords_reset)
