from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.errors import InvalidInput
from runs.tokens import api_token_create


class Command(BaseCommand):
    help = "Create an API token for a team (the team is created if needed). The raw token is printed once, last."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True)
        parser.add_argument("--name", required=True)
        parser.add_argument("--role", choices=["agent", "reviewer"], default="agent")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            token, raw = api_token_create(
                team_slug=options["team"], name=options["name"], role=options["role"]
            )
        except InvalidInput as error:
            raise CommandError(error.detail) from error
        self.stderr.write(
            f"Created {token.role} token {token.name!r} for team {token.team.slug}. It is shown once:"
        )
        self.stdout.write(raw)
