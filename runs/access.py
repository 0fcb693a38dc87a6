"""Who may do what, per team (DESIGN §5): the one role → capability table.

The API (`api.permissions`) and the console (`console.access`) both answer from this table;
neither holds a role model of its own.

A caller holds a token (`agent` or `reviewer`, one team) or is a session user with a Membership
role per team (`viewer`, `reviewer`, `admin`); staff and superusers are admins of every team.

| capability | agent token | reviewer token | viewer | reviewer | admin / staff |
|---|---|---|---|---|---|
| read: runs, stop packets, handoffs, stop quality, one approval | ✓ | ✓ | ✓ | ✓ | ✓ |
| approvals: the team's approvals list (the console's inbox, `GET /api/v1/approvals/`) | — | ✓ | ✓ | ✓ | ✓ |
| work: create, lease, permits, results, events, outbox, drained | ✓ | ✓ | — | — | — |
| stop | budget_exhausted, timeout, dependency_failure | ✓ | — | ✓ | ✓ (+ admin_kill) |
| review: take over, resume, close, resolve, release/discard, hand off, steer; decide approvals; read approval rules through the API | — | ✓ | — | ✓ | ✓ |
| audit: read the ledger through the API | — | ✓ | — | ✓ | ✓ |
| admin: the console's audit page, API tokens, denied attempts, admin_kill, approval rules (write) | — | — | — | — | ✓ |

An agent token reads the approvals of its own calls one by one (it waits on them); the list of
every approval of the team is for the people who watch it, viewers included, and reviewer tokens.

The membership roles' capability sets are nested (viewer ⊂ reviewer ⊂ admin), so "holds at least
the reviewer role" and "holds every capability of a reviewer" are the same question.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from runs.models import AGENT_STOP_REASONS, Membership, Role, StopReason, TokenRole


class Capability(enum.StrEnum):
    READ = "read"
    APPROVALS = "approvals"
    WORK = "work"
    STOP = "stop"
    REVIEW = "review"
    AUDIT = "audit"
    ADMIN = "admin"


TOKEN_CAPABILITIES: Mapping[str, frozenset[Capability]] = {
    TokenRole.AGENT: frozenset({Capability.READ, Capability.WORK, Capability.STOP}),
    TokenRole.REVIEWER: frozenset(
        {
            Capability.READ,
            Capability.APPROVALS,
            Capability.WORK,
            Capability.STOP,
            Capability.REVIEW,
            Capability.AUDIT,
        }
    ),
}
_VIEWER = frozenset({Capability.READ, Capability.APPROVALS})
_REVIEWER = _VIEWER | {Capability.STOP, Capability.REVIEW, Capability.AUDIT}
ROLE_CAPABILITIES: Mapping[str, frozenset[Capability]] = {
    Role.VIEWER: _VIEWER,
    Role.REVIEWER: _REVIEWER,
    Role.ADMIN: _REVIEWER | {Capability.ADMIN},
}
# Staff and superusers: an admin of every team (and never a worker: work needs a token).
EVERY_TEAM_CAPABILITIES = ROLE_CAPABILITIES[Role.ADMIN]
NO_CAPABILITIES: frozenset[Capability] = frozenset()

WHY_NOT: Mapping[Capability, str] = {
    Capability.APPROVALS: "the approvals list is for the team's members and reviewer tokens; "
    "an agent token reads its own approvals by id",
    Capability.WORK: "this is an agent endpoint: it needs an API token",
    Capability.STOP: "your role may not stop runs",
    Capability.REVIEW: "this needs a reviewer (a reviewer token, or the reviewer or admin role)",
    Capability.AUDIT: "the ledger is for reviewers and admins",
    Capability.ADMIN: "this needs an admin",
}

# Reasons the server gives itself; a caller claiming them would falsify the stop-quality figures.
SYSTEM_STOP_REASONS = frozenset({StopReason.LEASE_EXPIRED, StopReason.DRAIN_DEADLINE})
CALLER_STOP_REASONS = [reason for reason in StopReason.values if reason not in SYSTEM_STOP_REASONS]
# A token role listed here may stop only for these reasons; others may give any caller reason.
TOKEN_STOP_REASONS: Mapping[str, frozenset[str]] = {TokenRole.AGENT: AGENT_STOP_REASONS}


def stop_reason_refusal(
    reason: str, *, capabilities: frozenset[Capability], token_role: str | None = None
) -> str | None:
    """Why a holder of `capabilities` (and of a token of `token_role`, if any) may not stop a
    run for `reason`; None when it may."""
    allowed = TOKEN_STOP_REASONS.get(token_role or "")
    if allowed is not None and reason not in allowed:
        listed = ", ".join(sorted(allowed))
        return f"an agent token may stop a run only for {listed}; {reason} needs a reviewer"
    if reason == StopReason.ADMIN_KILL and Capability.ADMIN not in capabilities:
        return "admin_kill needs an admin of the run's team"
    return None


@dataclass(frozen=True)
class Grants:
    """What one caller may do: capabilities per team, or an admin's on every team."""

    every_team: bool = False
    by_team: Mapping[int, frozenset[Capability]] = field(default_factory=dict)

    @classmethod
    def for_token(cls, *, team_id: int, role: str) -> Grants:
        return cls(by_team={team_id: TOKEN_CAPABILITIES.get(role, NO_CAPABILITIES)})

    @classmethod
    def for_roles(cls, roles: Mapping[int, str], *, every_team: bool = False) -> Grants:
        if every_team:
            return cls(every_team=True)
        return cls(
            by_team={
                team_id: ROLE_CAPABILITIES.get(role, NO_CAPABILITIES)
                for team_id, role in roles.items()
            }
        )

    def on(self, team_id: int) -> frozenset[Capability]:
        if self.every_team:
            return EVERY_TEAM_CAPABILITIES
        return self.by_team.get(team_id, NO_CAPABILITIES)

    def may(self, capability: Capability, team_id: int) -> bool:
        return capability in self.on(team_id)

    def may_somewhere(self, capability: Capability) -> bool:
        if self.every_team:
            return capability in EVERY_TEAM_CAPABILITIES
        return any(capability in held for held in self.by_team.values())

    def team_ids(self, capability: Capability) -> list[int] | None:
        """Teams where the caller has `capability`; None means every team."""
        if self.every_team:
            return None
        return sorted(team_id for team_id, held in self.by_team.items() if capability in held)


def stop_refusals(
    team_ids: Iterable[int],
    *,
    reason: str,
    capabilities: Callable[[int], frozenset[Capability]],
    token_role: str | None = None,
) -> dict[int, str]:
    """For a stop of many runs at once: why the caller may not stop runs of each of `team_ids`
    for `reason` (teams where it may are left out). `capabilities(team_id)` is the caller's."""
    refusals: dict[int, str] = {}
    for team_id in team_ids:
        held = capabilities(team_id)
        why = (
            WHY_NOT[Capability.STOP]
            if Capability.STOP not in held
            else stop_reason_refusal(reason, capabilities=held, token_role=token_role)
        )
        if why is not None:
            refusals[team_id] = why
    return refusals


def is_admin_of_every_team(user: object) -> bool:
    return bool(getattr(user, "is_staff", False) or getattr(user, "is_superuser", False))


def membership_roles(*, user_id: int) -> dict[int, str]:
    """The user's role per team (one query)."""
    return dict(Membership.objects.filter(user_id=user_id).values_list("team_id", "role"))
