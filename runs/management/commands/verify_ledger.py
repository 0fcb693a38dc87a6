from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from runs.ledger import VERIFY_PROGRESS_EVERY, AnchorReport, VerifyProgress, ledger_verify
from runs.ledger_anchors import anchor_dir


class Command(BaseCommand):
    help = (
        "Verify the ledger's keyed hash chains and the chain heads anchored outside the database; "
        "exit 1 and name the first broken entry if one was changed or removed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--run", default=None, help="verify one run's chain only")
        parser.add_argument(
            "--progress-every",
            type=int,
            default=VERIFY_PROGRESS_EVERY,
            help="print a progress line every N entries (default %(default)s)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = AnchorReport()
        checked, broken = ledger_verify(
            run_id=options["run"],
            progress=self._progress,
            progress_every=options["progress_every"],
            report=report,
        )
        if broken is None:
            self.stdout.write(
                f"ledger OK: {checked} entries verified, "
                f"{report.anchored} chain heads found as anchored"
                + (
                    ""
                    if anchor_dir()
                    else " (anchors are off: SAFESTOP_LEDGER_ANCHOR_DIR is empty)"
                )
            )
            return
        self.stderr.write(
            f"ledger BROKEN at entry {broken.entry_id} (run {broken.run_id or '-'}, seq {broken.run_seq}): {broken.problem}"
        )
        raise SystemExit(1)

    def _progress(self, progress: VerifyProgress) -> None:
        # A million entries take a while: say how far it got and how fast, so an operator
        # can tell a slow walk from a stuck one.
        if progress.done:
            return
        self.stdout.write(
            f"verified {progress.checked:,} entries in {progress.seconds:.1f} s "
            f"({progress.rate:,.0f} entries/s)"
        )
