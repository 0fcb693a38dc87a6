"""Who may do what, per team (DESIGN §5).

A caller is a token (`agent` or `reviewer`, one team) or a session user (a Membership role per
team: `viewer`, `reviewer`, `admin`; staff and superusers are admins of every team).

| capability | agent token | reviewer token | viewer | reviewer | admin / staff |
|---|---|---|---|---|---|
| read runs, stop packets, metrics | ✓ | ✓ | ✓ | ✓ | ✓ |
| work (create, lease, permits, results, events, outbox, drained) | ✓ | ✓ | — | — | — |
| stop | budget_exhausted, timeout, dependency_failure | ✓ | — | ✓ | ✓ (+ admin_kill) |
| review (take over, resume, close, resolve, steer), read the ledger | — | ✓ | — | ✓ | ✓ |
| read denied attempts | — | — | — | — | ✓ |

Another team's run is a 404 (its existence is not revealed); a run the caller can see but may
not act on is a 403 naming what is missing. Both are counted as denials.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rest_framework import exceptions
from rest_framework.request import Request

from runs.actors import Actor
from runs.models import (
    AGENT_STOP_REASONS,
    ApiToken,
    Membership,
    Role,
    Run,
    StopReason,
    Team,
    TokenRole,
)


class Capability(enum.StrEnum):
    READ = "read"
    WORK = "work"
    STOP = "stop"
    REVIEW = "review"
    AUDIT = "audit"
    ADMIN = "admin"


_TOKEN_CAPABILITIES: dict[str, set[Capability]] = {
    TokenRole.AGENT: {Capability.READ, Capability.WORK, Capability.STOP},
    TokenRole.REVIEWER: {
        Capability.READ,
        Capability.WORK,
        Capability.STOP,
        Capability.REVIEW,
        Capability.AUDIT,
    },
}
_ROLE_CAPABILITIES: dict[str, set[Capability]] = {
    Role.VIEWER: {Capability.READ},
    Role.REVIEWER: {Capability.READ, Capability.STOP, Capability.REVIEW, Capability.AUDIT},
    Role.ADMIN: {
        Capability.READ,
        Capability.STOP,
        Capability.REVIEW,
        Capability.AUDIT,
        Capability.ADMIN,
    },
}
_WHY_NOT = {
    Capability.WORK: "this is an agent endpoint: it needs an API token",
    Capability.STOP: "your role may not stop runs",
    Capability.REVIEW: "this needs a reviewer (a reviewer token, or the reviewer or admin role)",
    Capability.AUDIT: "the ledger is for reviewers and admins",
    Capability.ADMIN: "this needs an admin",
}
# Reasons the server gives itself; a caller claiming them would falsify the stop-quality figures.
SYSTEM_STOP_REASONS = frozenset({StopReason.LEASE_EXPIRED, StopReason.DRAIN_DEADLINE})
API_STOP_REASONS = [reason for reason in StopReason.values if reason not in SYSTEM_STOP_REASONS]


class WrongTeam(exceptions.NotFound):
    """Another team's run: answered exactly like a run that does not exist, but counted."""


class WrongRole(exceptions.PermissionDenied):
    """The caller sees the run but may not do this to it."""


@dataclass(frozen=True)
class Caller:
    actor: Actor
    token: ApiToken | None = None
    user: Any = None
    every_team: bool = False  # staff / superuser
    capabilities: dict[int, frozenset[Capability]] = field(default_factory=dict)

    @classmethod
    def from_request(cls, request: Request) -> Caller:
        token = request.auth if isinstance(request.auth, ApiToken) else None
        if token is not None:
            return cls(
                actor=Actor.for_token(token),
                token=token,
                capabilities={token.team_id: frozenset(_TOKEN_CAPABILITIES[token.role])},
            )
        user = request.user
        if getattr(user, "is_staff", False) or getattr(user, "is_superuser", False):
            return cls(actor=Actor.for_user(user), user=user, every_team=True)
        roles = Membership.objects.filter(user_id=user.pk).values_list("team_id", "role")  # type: ignore[misc]
        return cls(
            actor=Actor.for_user(user),
            user=user,
            capabilities={
                team_id: frozenset(_ROLE_CAPABILITIES.get(role, set())) for team_id, role in roles
            },
        )

    @property
    def is_token(self) -> bool:
        return self.token is not None

    @property
    def credential(self) -> str:
        """How denials name the caller: the token's name, or the username."""
        if self.token is not None:
            return f"token:{self.token.name}"
        return f"user:{self.actor.name}"

    def may(self, capability: Capability, team_id: int) -> bool:
        if self.every_team:
            return capability != Capability.WORK
        return capability in self.capabilities.get(team_id, frozenset())

    def team_ids(self, capability: Capability) -> list[int] | None:
        """Teams where the caller has `capability`; None means every team."""
        if self.every_team:
            return None
        return sorted(team_id for team_id, caps in self.capabilities.items() if capability in caps)

    def team_slugs(self, capability: Capability) -> list[str] | None:
        team_ids = self.team_ids(capability)
        if team_ids is None:
            return None
        return list(Team.objects.filter(pk__in=team_ids).values_list("slug", flat=True))

    def require(self, capability: Capability, team_id: int | None = None) -> None:
        """For endpoints that are not about one run (list, ledger, metrics, create)."""
        allowed = (
            self.may(capability, team_id)
            if team_id is not None
            else (
                self.every_team
                and capability != Capability.WORK
                or any(capability in caps for caps in self.capabilities.values())
            )
        )
        if not allowed:
            raise WrongRole(_WHY_NOT.get(capability, "not allowed"))

    def check_stop_reason(self, reason: str, team_id: int) -> None:
        """Agent tokens stop their own runs only for budget, timeout or dependency failure."""
        if (
            self.token is not None
            and self.token.role == TokenRole.AGENT
            and reason not in AGENT_STOP_REASONS
        ):
            allowed = ", ".join(sorted(AGENT_STOP_REASONS))
            raise WrongRole(
                f"an agent token may stop a run only for {allowed}; {reason} needs a reviewer"
            )
        if reason == StopReason.ADMIN_KILL and not self.may(Capability.ADMIN, team_id):
            raise WrongRole("admin_kill needs an admin of the run's team")


def run_for(caller: Caller, run_id: str, capability: Capability) -> Run:
    """The run, if the caller's team owns it (else 404) and the caller may `capability` (else 403)."""
    run = (
        Run.objects.select_related("team").filter(pk=run_id).first()
        if plausible_run_id(run_id)
        else None
    )
    if run is None:
        raise exceptions.NotFound(f"run {run_id[:64]} does not exist")
    if not caller.may(Capability.READ, run.team_id):
        raise WrongTeam(f"run {run_id} does not exist")
    if not caller.may(capability, run.team_id):
        raise WrongRole(_WHY_NOT.get(capability, "not allowed"))
    return run


def run_id_for(caller: Caller, run_id: str, capability: Capability) -> str:
    """`run_for` for endpoints that only need the run's id (every agent write).

    The write's service locks and loads the run anyway; loading it here too cost the hottest
    endpoint (`events/`) a query per request. A run's team never changes and runs are never
    deleted, so the team is cached per process; a run that does not exist is never cached.
    """
    try:
        team_id = _run_team_id(run_id) if plausible_run_id(run_id) else None
    except Run.DoesNotExist:
        team_id = None
    if team_id is None:
        raise exceptions.NotFound(f"run {run_id[:64]} does not exist")
    if not caller.may(Capability.READ, team_id):
        raise WrongTeam(f"run {run_id} does not exist")
    if not caller.may(capability, team_id):
        raise WrongRole(_WHY_NOT.get(capability, "not allowed"))
    return run_id


@lru_cache(maxsize=8192)
def _run_team_id(run_id: str) -> int:
    # lru_cache does not keep exceptions: a missing run is looked up again next time.
    return Run.objects.values_list("team_id", flat=True).get(pk=run_id)


def plausible_run_id(run_id: str) -> bool:
    # Path text goes straight into a query: refuse what no run id can be (NUL bytes would make
    # PostgreSQL raise instead of answering "no such run").
    return (
        0 < len(run_id) <= 32
        and run_id.isascii()
        and run_id.replace("_", "").replace("-", "").isalnum()
    )
