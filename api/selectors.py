"""Read queries the API needs beyond `runs.selectors` (which it uses for runs and metrics)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from handoff.models import Resolution, StopPacket
from runs import ledger_queries, notify
from runs.ledger_queries import LedgerFilters
from runs.models import STOPPING_STATUSES, LedgerEntry, Run, RunStatus, StopRequest


def run_state(*, run_id: str) -> dict[str, Any]:
    """The run's status and epoch right now (after a service call returned something else)."""
    return dict(Run.objects.filter(pk=run_id).values("status", "stop_epoch").get())


def stop_packet_get(*, run: Run, epoch: int | None = None) -> StopPacket | None:
    packets = StopPacket.objects.filter(run=run)
    if epoch is not None:
        return packets.filter(stop_epoch=epoch).first()
    return packets.order_by("-stop_epoch").first()


def resolutions_for(*, run: Run) -> list[dict[str, Any]]:
    return [
        {
            "target": resolution.target,
            "id": resolution.target_id,
            "decision": resolution.decision,
            "evidence": resolution.evidence,
            "by": resolution.by,
            "at": resolution.at.isoformat(),
        }
        for resolution in Resolution.objects.filter(run=run).order_by("at", "id")
    ]


def ledger_entries(
    *,
    team_slugs: list[str] | None,
    run_id: str | None = None,
    actor: str | None = None,
    action: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[LedgerEntry]:
    """`GET /ledger/`'s query parameters on the one ledger query (`runs.ledger_queries`, whose
    filter rules the console's audit page shares)."""
    return ledger_queries.ledger_entries(
        team_slugs=team_slugs,
        filters=LedgerFilters(
            run=run_id or "", actor=actor or "", action=action or "", since=since, until=until
        ),
    )


# A worker connecting to a run in these states is told to stop at once.
SIGNALLED_STATUSES = frozenset(
    {
        RunStatus.CANCEL_REQUESTED,
        RunStatus.DRAINING,
        RunStatus.STOPPED_CLEANLY,
        RunStatus.STOPPED_DIRTY,
        RunStatus.HANDED_OFF,
    }
)


def current_stop_signal(*, run_id: str) -> tuple[dict[str, Any] | None, bool]:
    """(the signal a worker of this run should act on, or None; whether the stop is still in
    progress — only then does delivering it count towards the "time to worker" figure)."""
    run = Run.objects.filter(pk=run_id).only("status").first()
    if run is None or run.status not in SIGNALLED_STATUSES:
        return None, False
    stop_request = StopRequest.objects.filter(run_id=run_id).order_by("-epoch_after").first()
    if stop_request is None:
        return None, False
    return notify.signal_payload(stop_request), run.status in STOPPING_STATUSES
