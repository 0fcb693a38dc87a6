"""`manage.py reprice --dry-run | --write [--team SLUG]`: price stored usage again."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from runs.actors import Actor
from runs.models import Team
from runs.pricing import TABLE_VERSION
from runs.services.reprice import reprice_apply, reprice_plan, reprice_summary


class Command(BaseCommand):
    help = (
        "Show what the installed price table and the teams' own prices would change in stored "
        "usage costs (--dry-run), or write it (--write; ledgered as usage.repriced on each "
        "run). Provider-reported costs are never repriced. Nothing changes stored costs "
        "except --write."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        mode = parser.add_mutually_exclusive_group(required=True)
        mode.add_argument("--dry-run", action="store_true", help="show the changes, write nothing")
        mode.add_argument("--write", action="store_true", help="write the changes, ledgered")
        parser.add_argument("--team", help="one team's usage (its slug)")

    def handle(self, *args: Any, **options: Any) -> None:
        team_id = None
        if options["team"]:
            team = Team.objects.filter(slug=options["team"]).first()
            if team is None:
                raise CommandError(f"no team {options['team']!r}")
            team_id = team.pk
        changes = reprice_plan(team_id=team_id)
        self.stdout.write(f"price table: {TABLE_VERSION}")
        if not changes:
            self.stdout.write("no stored cost would change")
            return
        self.stdout.write(f"{'model':<40} {'rows':>6} {'old USD':>16} {'new USD':>16}  notes")
        for line in reprice_summary(changes):
            notes = []
            if line["priced"]:
                notes.append(f"{line['priced']} unpriced → priced")
            if line["unpriced"]:
                notes.append(f"{line['unpriced']} priced → unpriced")
            self.stdout.write(
                f"{line['model'][:40]:<40} {line['rows']:>6} {line['old']:>16.6f} "
                f"{line['new']:>16.6f}  {', '.join(notes)}"
            )
        runs = len({change.run_id for change in changes})
        if options["dry_run"]:
            self.stdout.write(
                f"{len(changes)} rows in {runs} runs would change (dry run: nothing written; "
                "--write writes them)"
            )
            return
        written = reprice_apply(changes, actor=Actor.system("reprice"))
        self.stdout.write(f"{written} rows in {runs} runs repriced (ledgered: usage.repriced)")
