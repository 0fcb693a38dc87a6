"""`python manage.py demo_setup`: the demo teams and users, with their passwords printed, and
the demo teams' approval rules.

Idempotent (run by every `manage.py serve` unless `--no-demo`). The accounts exist only because
the demo asked for them: no migration creates users. `--language` (default
`SAFESTOP_DEMO_LANGUAGE`, else `en`) is the language of the names a reader sees: team, rule and
channel names, policy descriptions (`console.demo.words`).
"""

from __future__ import annotations

import os
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from console.demo.accounts import (
    DEMO_APPROVAL_RULES,
    DEMO_POLICIES,
    DEMO_TEAMS,
    DEMO_USERS,
    demo_accounts_ensure,
)
from console.demo.mcp import demo_mcp_ensure
from console.demo.words import LANGUAGES, spellings, words
from notifications.demo import DEMO_CHANNEL, demo_channels_ensure


class Command(BaseCommand):
    help = (
        "Create the demo teams, the admin / reviewer / viewer users and the demo approval "
        "rules (idempotent)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--language",
            choices=LANGUAGES,
            default=(os.environ.get("SAFESTOP_DEMO_LANGUAGE") or "en").lower(),
            help="the language of the demo's team, rule and channel names and policy "
            "descriptions (default: SAFESTOP_DEMO_LANGUAGE, else en)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        language = options["language"]
        report = demo_accounts_ensure(language=language)
        # mail, kept for the demo's outbox
        demo_channels_ensure(
            [slug for slug, _ in DEMO_TEAMS],
            name=words(language, DEMO_CHANNEL),
            also_named=spellings(DEMO_CHANNEL),
            language=language,
        )
        teams = ", ".join(slug for slug, _ in DEMO_TEAMS)
        self.stdout.write(
            f"Demo accounts ready (teams: {teams}; "
            f"{report.users_created} user(s) created, {report.passwords_reset} password(s) reset)."
        )
        self.stdout.write("  user       password        can")
        for user in DEMO_USERS:
            self.stdout.write(f"  {user.username:<10} {user.password:<15} {user.can}")
        self.stdout.write(
            self.style.WARNING(
                "  These are demo passwords: never run the demo on a reachable host."
            )
        )
        self.stdout.write(
            f"Demo approval rules ({report.rules_created} created; see /approvals/rules/):"
        )
        for team, rule in DEMO_APPROVAL_RULES:
            self.stdout.write(f"  {team:<10} {rule['name']}")
        self.stdout.write(f"Demo policies ({report.policies_created} created; see /policies/):")
        for team, policy in DEMO_POLICIES:
            self.stdout.write(f"  {team:<10} {policy['name']} ({policy['mode']})")
        upstream = demo_mcp_ensure()
        if upstream is None:
            self.stdout.write(
                "MCP gateway: `make mcp-servers` installs server-everything for the demo."
            )
        else:
            self.stdout.write(
                f"MCP gateway: /mcp/{upstream.name}/ → server-everything (team "
                f"{upstream.team.slug}); connect an MCP client with an agent token of that "
                'team (docs/agents.md, "No code").'
            )
