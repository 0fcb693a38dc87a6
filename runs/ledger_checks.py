"""Recorded ledger verifications: who asked for a walk of every hash chain, when it ran, how many
entries it checked and the first break it found.

A walk reads the whole ledger: 22–25 s for 1,000,000 entries (docs/BENCHMARKS.md). So no page
request walks it. The audit page shows the latest recorded walk and asks for a new one; a Celery
worker (or, in the embedded default, a thread of the serving process) claims it, walks and
records the outcome (`notifications.services.ledger_check`, which also announces a break). The
scheduled walk (beat, or the background loop) is recorded the same way, as `scheduled`. A clean
walk ends by anchoring the chains' heads outside the database (runs/ledger_anchors.py), which the
next walks check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.utils import timezone

from runs.ledger import AnchorReport, ChainBreak, VerifyProgress, ledger_verify
from runs.ledger_anchors import anchor_dir, anchor_write
from runs.models import LedgerVerification

SCHEDULED = "scheduled"
# A walk not finished this long after it was asked for died with its worker: a new one may start.
STALE_AFTER = timedelta(hours=1)

logger = logging.getLogger(__name__)


def verification_latest() -> LedgerVerification | None:
    return LedgerVerification.objects.order_by("-requested_at", "-id").first()


def verification_last_finished() -> LedgerVerification | None:
    return (
        LedgerVerification.objects.filter(finished_at__isnull=False)
        .order_by("-finished_at", "-id")
        .first()
    )


def verification_is_open(verification: LedgerVerification) -> bool:
    """Queued or running, and not abandoned."""
    return (
        verification.finished_at is None
        and verification.requested_at > timezone.now() - STALE_AFTER
    )


def verification_request(*, requested_by: str) -> tuple[LedgerVerification, bool]:
    """The walk already queued or running, or a new queued one (then True): a second click, or a
    second admin, does not start a second walk of the same ledger. (Two requests in the same
    instant may both queue one; both walks are correct, one is wasted.)"""
    latest = verification_latest()
    if latest is not None and verification_is_open(latest):
        return latest, False
    created = LedgerVerification.objects.create(
        requested_by=requested_by[:150], requested_at=timezone.now()
    )
    return created, True


def verification_claim(verification_id: int) -> LedgerVerification | None:
    """Mark a queued walk as started; None when another worker started it first (a redelivered
    task), or it does not exist."""
    started = LedgerVerification.objects.filter(pk=verification_id, started_at__isnull=True).update(
        started_at=timezone.now()
    )
    if not started:
        return None
    return LedgerVerification.objects.get(pk=verification_id)


def verification_start_scheduled() -> LedgerVerification:
    now = timezone.now()
    return LedgerVerification.objects.create(
        requested_by=SCHEDULED, requested_at=now, started_at=now
    )


def verification_run(
    verification: LedgerVerification, *, progress: Callable[[VerifyProgress], None] | None = None
) -> ChainBreak | None:
    """Walk every chain and record what was found on `verification` (already claimed). A walk
    that fails is recorded as failed, with why, and the exception goes on."""
    report = AnchorReport()
    try:
        checked, broken = ledger_verify(progress=progress, report=report)
    except Exception as failure:
        verification.error = f"{type(failure).__name__}: {failure}"[:2000]
        verification.finished_at = timezone.now()
        verification.save(update_fields=["error", "finished_at"])
        raise
    verification.checked = checked
    verification.anchored_heads = report.anchored
    if broken is None:
        _anchor(verification, report, checked=checked)
    verification.finished_at = timezone.now()
    if broken is not None:
        verification.broken_entry_id = broken.entry_id
        verification.broken_run_id = broken.run_id or ""
        verification.broken_run_seq = broken.run_seq
        verification.problem = broken.problem
    verification.save(
        update_fields=[
            "checked",
            "finished_at",
            "broken_entry_id",
            "broken_run_id",
            "broken_run_seq",
            "problem",
            "anchored_heads",
            "anchor_written",
            "anchor_error",
        ]
    )
    return broken


def _anchor(verification: LedgerVerification, report: AnchorReport, *, checked: int) -> None:
    """Sign the heads of the chains that grew since the last anchor, outside the database. Only
    after a clean walk: an anchor vouches for what it names. A walk that found nothing new
    writes nothing; one that cannot write says why, and its verdict stands."""
    if anchor_dir() is None or not report.moved:
        return
    try:
        verification.anchor_written = anchor_write(report.moved, checked=checked)
    except OSError as failure:
        logger.error("ledger anchor not written: %s", failure)
        verification.anchor_error = f"{type(failure).__name__}: {failure}"[:2000]


def verification_break(verification: LedgerVerification) -> ChainBreak | None:
    if verification.broken_entry_id is None:
        return None
    return ChainBreak(
        verification.broken_entry_id,
        verification.broken_run_id or None,
        verification.broken_run_seq or 0,
        verification.problem,
    )
