"""Who may see and do what in the console: roles scoped to teams.

The rules are the one role → capability table in `runs.access` (DESIGN §5), which the API asks
too: a viewer reads the team's runs, packets, handoffs, approvals and stop quality; a reviewer also stops,
takes over, resolves, releases/discards, hands off, resumes, closes and steers; an admin also
has the audit page and the team's API tokens; `is_staff` / `is_superuser` is an admin of every
team.

Every console view and browser websocket consumer asks this module, never `Membership`
directly. A run outside the user's teams is reported as not found (its existence is not
revealed); a run the user can see but not act on is a 403.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from runs.access import (
    EVERY_TEAM_CAPABILITIES,
    NO_CAPABILITIES,
    ROLE_CAPABILITIES,
    Capability,
    is_admin_of_every_team,
    membership_roles,
)
from runs.models import Role, Run, Team


@dataclass(frozen=True)
class Access:
    """One user's roles, read once per request (one query)."""

    user_id: int | None
    all_teams: bool = False
    roles: dict[int, str] = field(default_factory=dict)

    @property
    def team_ids(self) -> list[int] | None:
        """The teams whose runs this user may see; None means every team (staff)."""
        return None if self.all_teams else sorted(self.roles)

    def role_for(self, team_id: int) -> str | None:
        return Role.ADMIN if self.all_teams else self.roles.get(team_id)

    def capabilities(self, team_id: int) -> frozenset[Capability]:
        if self.all_teams:
            return EVERY_TEAM_CAPABILITIES
        return ROLE_CAPABILITIES.get(self.roles.get(team_id, ""), NO_CAPABILITIES)

    def may(self, capability: Capability, team_id: int) -> bool:
        return capability in self.capabilities(team_id)

    def has(self, team_id: int, role: str) -> bool:
        """Whether the user holds at least `role` here: every capability the role grants."""
        return ROLE_CAPABILITIES[role] <= self.capabilities(team_id)

    def can_view(self, team_id: int) -> bool:
        return self.may(Capability.READ, team_id)

    def can_act(self, team_id: int) -> bool:
        return self.may(Capability.REVIEW, team_id)

    def can_admin(self, team_id: int) -> bool:
        return self.may(Capability.ADMIN, team_id)

    def ids_may(self, capability: Capability) -> list[int] | None:
        """Teams where the user has `capability`; None means every team."""
        if self.all_teams:
            return None
        return sorted(team_id for team_id in self.roles if self.may(capability, team_id))

    def ids_with(self, role: str) -> list[int] | None:
        """Teams where the user holds at least `role`; None means every team."""
        if self.all_teams:
            return None
        return sorted(team_id for team_id in self.roles if self.has(team_id, role))

    @property
    def is_reviewer_anywhere(self) -> bool:
        return self.all_teams or any(self.has(team_id, Role.REVIEWER) for team_id in self.roles)

    @property
    def is_admin_anywhere(self) -> bool:
        return self.all_teams or any(self.has(team_id, Role.ADMIN) for team_id in self.roles)

    @property
    def highest_role(self) -> str:
        if self.all_teams:
            return Role.ADMIN
        if not self.roles:
            return ""
        # The roles' capabilities are nested, so the role granting the most is the highest.
        return max(self.roles.values(), key=lambda role: len(ROLE_CAPABILITIES[role]))


def access_for(user: object) -> Access:
    """Build a user's Access. Anonymous or inactive users get no teams at all."""
    if not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
        return Access(user_id=None)
    if is_admin_of_every_team(user):
        return Access(user_id=user.pk, all_teams=True)  # type: ignore[attr-defined]
    return Access(user_id=user.pk, roles=membership_roles(user_id=user.pk))  # type: ignore[attr-defined]


def request_access(request: HttpRequest) -> Access:
    """The request user's Access, cached on the request so a page asks the database once."""
    cached = getattr(request, "_safestop_access", None)
    if cached is None:
        cached = access_for(request.user)
        request._safestop_access = cached  # type: ignore[attr-defined]
    return cached


def visible_teams(access: Access) -> list[Team]:
    teams = Team.objects.order_by("slug")
    return list(teams if access.all_teams else teams.filter(pk__in=access.team_ids or []))


def run_for(request: HttpRequest, run_id: str, *, need: str = Role.VIEWER) -> Run:
    """The run, if the user may see it (else 404) and holds `need` on its team (else 403)."""
    access = request_access(request)
    run = Run.objects.select_related("team").filter(pk=run_id).first()
    if run is None or not access.can_view(run.team_id):
        raise Http404("no such run")
    if not access.has(run.team_id, need):
        raise PermissionDenied(f"you need the {need} role on team {run.team.slug} for this")
    return run


def require(request: HttpRequest, team_id: int, role: str) -> None:
    if not request_access(request).has(team_id, role):
        raise PermissionDenied(f"you need the {role} role on this team")


def user_may_view_run(user: object, run_id: str) -> bool:
    """For the browser websocket: may this (session) user watch this run?"""
    access = access_for(user)
    team_id = Run.objects.filter(pk=run_id).values_list("team_id", flat=True).first()
    return team_id is not None and access.can_view(team_id)


def user_team_ids(user: object) -> list[int]:
    """For the runs-page websocket: every team the user may watch (all teams for staff)."""
    access = access_for(user)
    if access.user_id is None:
        return []
    if access.all_teams:
        return list(Team.objects.order_by("pk").values_list("pk", flat=True))
    return access.team_ids or []
