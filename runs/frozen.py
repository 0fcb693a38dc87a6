"""Freezing by epoch (DESIGN §6): what "frozen" means to every reader of the outbox.

A stop does not rewrite the run's pending outbox rows: it bumps the run's epoch, and from its
commit on an item still `pending` at an epoch below its run's current one *is* frozen. Only a
stop leaves such an item: an enqueue needs the current epoch, an interruption relabels at once,
a resume from suspension moves the run's current items to the new epoch with it. The rows are
relabelled `frozen` later, in bounded batches (`runs.services.outbox_relabel_frozen`), so the
stop's commit costs the same for 10 pending items and 100,000.

Until then each reader applies the rule itself:

- the dispatcher claims only items at the run's current epoch (`runs.services.outbox_claim`);
- queries use `frozen_q` / `pending_q` (the run's epoch through the join);
- code holding items of one run calls `present(run, items)`, which shows an item frozen by epoch
  as the relabel will write it: `frozen`, with the freezing stop's epoch and time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TypeVar

from django.db.models import F, Q

from runs.models import OutboxItem, OutboxStatus, Run, StopRequest

Item = TypeVar("Item", bound=OutboxItem)


def frozen_by_epoch_q(prefix: str = "") -> Q:
    """Pending rows below their run's epoch: frozen, not yet relabelled. `prefix` is the path
    from the queried model to the outbox item (e.g. `"outbox_item__"`)."""
    return Q(
        **{
            f"{prefix}status": OutboxStatus.PENDING,
            f"{prefix}enqueue_epoch__lt": F(f"{prefix}run__stop_epoch"),
        }
    )


def frozen_q(prefix: str = "") -> Q:
    """Frozen items: relabelled, or frozen by their run's epoch."""
    return Q(**{f"{prefix}status": OutboxStatus.FROZEN}) | frozen_by_epoch_q(prefix)


def pending_q(prefix: str = "") -> Q:
    """Pending items that are still pending: at their run's current epoch."""
    return Q(
        **{
            f"{prefix}status": OutboxStatus.PENDING,
            f"{prefix}enqueue_epoch__gte": F(f"{prefix}run__stop_epoch"),
        }
    )


def frozen_of_run_q(run: Run) -> Q:
    """`frozen_q` for the items of one run whose epoch is known (no join)."""
    return Q(status=OutboxStatus.FROZEN) | Q(
        status=OutboxStatus.PENDING, enqueue_epoch__lt=run.stop_epoch
    )


def is_frozen_by_epoch(item: OutboxItem, run: Run) -> bool:
    return item.status == OutboxStatus.PENDING and item.enqueue_epoch < run.stop_epoch


def freezing_stops(run: Run, *, above_epoch: int) -> list[tuple[int, datetime]]:
    """The run's stops after `above_epoch`, oldest first: (epoch after the stop, requested at).
    A stop is the only thing that leaves a pending item below its run's epoch, so the first one
    above an item's enqueue epoch is the stop that froze it."""
    return list(
        StopRequest.objects.filter(run_id=run.pk, epoch_after__gt=above_epoch)
        .order_by("epoch_after")
        .values_list("epoch_after", "requested_at")
    )


def freezing_stop(
    stops: Sequence[tuple[int, datetime]], run: Run, enqueue_epoch: int
) -> tuple[int, datetime | None]:
    """(epoch, time) of the stop that froze an item enqueued at `enqueue_epoch`. Without a
    recorded stop (a row older than the rule) it is the run's epoch and its last stop time."""
    for epoch_after, requested_at in stops:
        if epoch_after > enqueue_epoch:
            return epoch_after, requested_at
    return run.stop_epoch, run.stop_requested_at


def present(run: Run, items: Iterable[Item]) -> list[Item]:
    """`items` (all of `run`) as readers see them: an item frozen by epoch shows as the relabel
    will write it. In memory only; one query, only when such an item is among them."""
    items = list(items)
    stale = [item for item in items if is_frozen_by_epoch(item, run)]
    if not stale:
        return items
    stops = freezing_stops(run, above_epoch=min(item.enqueue_epoch for item in stale))
    for item in stale:
        item.frozen_by_epoch, item.frozen_at = freezing_stop(stops, run, item.enqueue_epoch)
        item.status = OutboxStatus.FROZEN
    return items
