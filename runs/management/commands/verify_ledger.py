from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs.ledger import ledger_verify


class Command(BaseCommand):
    help = "Verify the ledger's hash chains; exit 1 and name the first broken entry if one was changed."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", default=None, help="verify one run's chain only")

    def handle(self, *args: Any, **options: Any) -> None:
        checked, broken = ledger_verify(run_id=options["run"])
        if broken is None:
            self.stdout.write(f"ledger OK: {checked} entries verified")
            return
        self.stderr.write(
            f"ledger BROKEN at entry {broken.entry_id} (run {broken.run_id or '-'}, seq {broken.run_seq}): {broken.problem}"
        )
        raise SystemExit(1)
