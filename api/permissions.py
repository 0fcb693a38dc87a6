"""Who may do what through the API: the caller of a request, and the run checks.

The rules are the one role → capability table in `runs.access` (DESIGN §5): agent and reviewer
tokens, viewer / reviewer / admin memberships, staff and superusers as admins of every team.

Another team's run is a 404 (its existence is not revealed); a run the caller can see but may
not act on is a 403 naming what is missing. Both are counted as denials.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from rest_framework import exceptions
from rest_framework.request import Request

from runs.access import (
    CALLER_STOP_REASONS,
    SYSTEM_STOP_REASONS,
    WHY_NOT,
    Capability,
    Grants,
    is_admin_of_every_team,
    membership_roles,
    stop_reason_refusal,
)
from runs.actors import Actor
from runs.models import ApiToken, Run, Team

__all__ = [
    "API_STOP_REASONS",
    "SYSTEM_STOP_REASONS",
    "Caller",
    "Capability",
    "WrongRole",
    "WrongTeam",
    "plausible_run_id",
    "run_for",
    "run_id_for",
]

API_STOP_REASONS = CALLER_STOP_REASONS


class WrongTeam(exceptions.NotFound):
    """Another team's run: answered exactly like a run that does not exist, but counted."""


class WrongRole(exceptions.PermissionDenied):
    """The caller sees the run but may not do this to it."""


@dataclass(frozen=True)
class Caller:
    actor: Actor
    token: ApiToken | None = None
    user: Any = None
    grants: Grants = field(default_factory=Grants)

    @classmethod
    def from_request(cls, request: Request) -> Caller:
        token = request.auth if isinstance(request.auth, ApiToken) else None
        if token is not None:
            return cls(
                actor=Actor.for_token(token),
                token=token,
                grants=Grants.for_token(team_id=token.team_id, role=token.role),
            )
        user = request.user
        every_team = is_admin_of_every_team(user)
        roles = {} if every_team else membership_roles(user_id=user.pk)  # type: ignore[arg-type]
        return cls(
            actor=Actor.for_user(user),
            user=user,
            grants=Grants.for_roles(roles, every_team=every_team),
        )

    @property
    def is_token(self) -> bool:
        return self.token is not None

    @property
    def every_team(self) -> bool:
        """Staff / superuser."""
        return self.grants.every_team

    @property
    def credential(self) -> str:
        """How denials name the caller: the token's name, or the username."""
        if self.token is not None:
            return f"token:{self.token.name}"
        return f"user:{self.actor.name}"

    def may(self, capability: Capability, team_id: int) -> bool:
        return self.grants.may(capability, team_id)

    def team_ids(self, capability: Capability) -> list[int] | None:
        """Teams where the caller has `capability`; None means every team."""
        return self.grants.team_ids(capability)

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
            else self.grants.may_somewhere(capability)
        )
        if not allowed:
            raise WrongRole(WHY_NOT.get(capability, "not allowed"))

    def check_stop_reason(self, reason: str, team_id: int) -> None:
        """Agent tokens stop their own runs only for budget, timeout or dependency failure."""
        refusal = stop_reason_refusal(
            reason,
            capabilities=self.grants.on(team_id),
            token_role=self.token.role if self.token is not None else None,
        )
        if refusal is not None:
            raise WrongRole(refusal)


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
        raise WrongRole(WHY_NOT.get(capability, "not allowed"))
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
        raise WrongRole(WHY_NOT.get(capability, "not allowed"))
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
