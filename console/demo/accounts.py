"""Demo teams, users and approval rules: created by `manage.py demo_setup` only, never by a
migration.

Idempotent: running it again changes nothing (a password is only reset when it no longer
matches the demo one, so a second `serve` does not log everybody out; a rule is only created
when its team has no rule of that name, so an admin's edits to a demo rule stay).

Names and descriptions a reader sees (team names, rule names, policy descriptions) are written
in the demo's language (`console.demo.words`): they are the admins' own words, stored as typed.
A rule or policy is looked up under its name in every demo language, so setting the demo up
again in another language adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction

from console.demo.words import spellings, words
from policies.models import Policy
from policies.services import policy_create
from runs.actors import Actor
from runs.models import ApprovalRule, Membership, Role, Team, TeamBudget, TeamPrice
from runs.services import approval_rule_create, team_budget_set, team_price_set
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


# The demo teams' approval rules (DESIGN §10): the simulator's payment, deploy and customer
# email agents (`console.demo.scenarios.APPROVAL_SCENARIOS`) are held by these, so approvals
# arrive in the inbox within seconds of `serve`. (team slug, rule fields)
DEMO_APPROVAL_RULES: tuple[tuple[str, dict[str, object]], ...] = (
    (
        "payments",
        {
            "name": "Payments need a reviewer",
            "applies_to": "tool_call",
            "tool_glob": "payments.*",
            "side_effect": "write",
            "risk": "high",
            "timeout_seconds": 900,
            "escalate_after_seconds": 300,
        },
    ),
    (
        "payments",
        {
            "name": "Customer email",
            "applies_to": "outbox",
            "transport": "email",
            "destination_glob": "*@customer.example",
            "risk": "medium",
            "timeout_seconds": 600,
            "escalate_after_seconds": 180,
        },
    ),
    (
        "platform",
        {
            "name": "Production deploys",
            "applies_to": "tool_call",
            "tool_glob": "deploy.*",
            "side_effect": "write",
            "risk": "high",
            "timeout_seconds": 900,
            "escalate_after_seconds": 300,
        },
    ),
)


# Policies (DESIGN §14): two enforcing ones the simulator's `looping` and `flaky` agents trip
# within a minute of `make run`, and one in observe mode that records what it would have done.
DEMO_POLICIES: tuple[tuple[str, dict[str, object]], ...] = (
    (
        "platform",
        {
            "name": "demo-loop",
            "description": "The same call five times in a row is a loop: stop it.",
            "expression": "call.repeats >= 5",
            "action": "stop",
            "mode": "enforce",
            "agent_glob": "looping-*",
        },
    ),
    (
        "payments",
        {
            "name": "demo-failure-streak",
            "description": "Three failed tool results in a row: stop before it makes it worse.",
            "expression": "run.tool_failures_in_a_row >= 3",
            "action": "stop",
            "mode": "enforce",
            "agent_glob": "ledger-sync-*",
        },
    ),
    (
        "payments",
        {
            "name": "demo-long-runs",
            "description": "Observe only: which runs would a 20-second limit have stopped?",
            "expression": "run.elapsed_seconds > 20.0",
            "action": "stop",
            "mode": "observe",
        },
    ),
)


@dataclass(frozen=True)
class EnsureReport:
    teams_created: int
    users_created: int
    memberships_created: int
    passwords_reset: int
    rules_created: int = 0
    policies_created: int = 0


def demo_accounts_ensure(*, language: str = "en") -> EnsureReport:
    """Create (or bring back to the demo state) the demo teams, users and memberships; what a
    reader sees of them is written in `language`."""
    user_model = get_user_model()
    teams_created = users_created = memberships_created = passwords_reset = 0
    with transaction.atomic():
        teams = []
        for slug, name in DEMO_TEAMS:
            existed = Team.objects.filter(slug=slug).exists()
            teams.append(team_ensure(slug=slug, name=words(language, name)))
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
        rules_created = demo_rules_ensure(language=language)
        demo_costs_ensure(language=language)
        policies_created = demo_policies_ensure(language=language)
    return EnsureReport(
        teams_created,
        users_created,
        memberships_created,
        passwords_reset,
        rules_created,
        policies_created,
    )


def _demo_team(slug: str, language: str) -> Team:
    return team_ensure(slug=slug, name=words(language, dict(DEMO_TEAMS).get(slug, slug)))


def demo_rules_ensure(*, language: str = "en") -> int:
    """Create each demo approval rule its team does not have yet (by name); returns how many.

    Through the rule service, so each is validated and ledgered like an admin's rule.
    """
    created = 0
    actor = Actor.system("demo-setup")
    for slug, fields in DEMO_APPROVAL_RULES:
        team = _demo_team(slug, language)
        name = str(fields["name"])
        if ApprovalRule.objects.filter(team=team, name__in=spellings(name)).exists():
            continue
        approval_rule_create(
            team_id=team.pk, actor=actor, **{**fields, "name": words(language, name)}
        )
        created += 1
    return created


# The payments team's own price for a model the price table lacks (its `payout-bot` calls it),
# and a daily budget for payments, so the budgets page shows a period's spend.
DEMO_TEAM_PRICES = [
    ("payments", {"model": "qwen-max", "input_usd_per_mtok": "1.6", "output_usd_per_mtok": "6.4"})
]
DEMO_TEAM_BUDGETS = [("payments", {"time_zone": "UTC", "daily_usd": "20", "monthly_usd": "400"})]


def demo_costs_ensure(*, language: str = "en") -> None:
    """The demo's team prices and budgets, each set once (through the services: ledgered);
    an admin's later change is kept."""
    actor = Actor.system("demo-setup")
    for slug, fields in DEMO_TEAM_PRICES:
        team = _demo_team(slug, language)
        if not TeamPrice.objects.filter(team=team, model=fields["model"]).exists():
            team_price_set(team_id=team.pk, actor=actor, **fields)
    for slug, budget in DEMO_TEAM_BUDGETS:
        team = _demo_team(slug, language)
        if not TeamBudget.objects.filter(team=team).exists():
            team_budget_set(team_id=team.pk, actor=actor, **budget)


def demo_policies_ensure(*, language: str = "en") -> int:
    """Create each demo policy its team does not have yet (by name), through the policy
    service (compiled, type-checked, ledgered); returns how many. Its name is an identifier
    (`demo-loop`), its description prose in `language`."""
    created = 0
    actor = Actor.system("demo-setup")
    for slug, fields in DEMO_POLICIES:
        team = _demo_team(slug, language)
        if Policy.objects.filter(team=team, name=fields["name"]).exists():
            continue
        description = words(language, str(fields["description"]))
        policy_create(team_id=team.pk, actor=actor, **{**fields, "description": description})
        created += 1
    return created
