"""The relabel after a stop: pending rows the stop's epoch froze become `frozen` rows.

Bookkeeping, not a transition: from the stop's commit on these items are frozen to every reader
(`runs.frozen`), so nothing a reader sees changes here — no ledger entry, no "run changed". It
runs after the stop, in bounded batches, each a short transaction under the run lock (the lock
every service that writes outbox items takes first, so a batch never deadlocks with a close or a
reviewer's decision on the same rows).
"""

from __future__ import annotations

from django.db.models import Subquery
from django.utils import timezone

from runs import frozen
from runs.models import OutboxItem, OutboxStatus
from runs.services._base import locked_run

# Rows per batch: about 10 ms of PostgreSQL writing under the run lock (docs/BENCHMARKS.md).
RELABEL_BATCH = 1000


def outbox_relabel_frozen(*, run_id: str, limit: int = RELABEL_BATCH) -> int:
    """Relabel up to `limit` of the run's items frozen by its epoch; returns how many. Call it
    again while it returns `limit`. Each row gets the epoch and time of the stop that froze it."""
    with locked_run(run_id) as run:
        stale = OutboxItem.objects.filter(
            run_id=run.pk, status=OutboxStatus.PENDING, enqueue_epoch__lt=run.stop_epoch
        )
        lowest = stale.order_by("enqueue_epoch").values_list("enqueue_epoch", flat=True).first()
        if lowest is None:
            return 0
        now = timezone.now()
        stops = frozen.freezing_stops(run, above_epoch=lowest)
        # The first stop above an item's epoch froze it; a row with no recorded stop above it
        # (older than the rule) is frozen by the run's epoch as it stands.
        bounds = [*stops, (run.stop_epoch, run.stop_requested_at or now)]
        done = 0
        for epoch_after, requested_at in bounds:
            if done >= limit:
                break
            below = stale.filter(enqueue_epoch__lt=epoch_after)
            done += OutboxItem.objects.filter(
                pk__in=Subquery(below.order_by().values("pk")[: limit - done]),
                status=OutboxStatus.PENDING,
            ).update(
                status=OutboxStatus.FROZEN,
                frozen_at=requested_at or now,
                frozen_by_epoch=epoch_after,
                updated_at=now,
            )
        return done
