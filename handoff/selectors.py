"""Read queries over handoff records, and the stop-quality figures that combine them with the
runs figures (`runs.selectors`). Used by the API, the console and the metrics endpoint."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, F, Q, QuerySet, Sum

from handoff.models import Handoff, HandoffStatus
from runs.models import RejectedWrite, StopRequest, Usage
from runs.selectors import (
    approval_figures,
    interruptions_recovered,
    latency_summary,
    side_effect_leakage,
    team_filter,
)


def stop_quality(
    *, since: datetime, until: datetime, team_ids: list[int] | None = None
) -> dict[str, Any]:
    """The five stop-quality figures of DESIGN §7 for stops requested in [since, until), and
    the approval figures of DESIGN §10 for approvals requested in the same period."""
    stops = team_filter(
        StopRequest.objects.filter(requested_at__gte=since, requested_at__lt=until),
        team_ids,
        "run__team_id",
    )
    stop_rows = list(
        stops.values(
            "requested_at", "stopped_at", "signal_delivered_at", "outcome_state", "dirty_reasons"
        )
    )
    to_stopped = [
        (row["stopped_at"] - row["requested_at"]).total_seconds() * 1000
        for row in stop_rows
        if row["stopped_at"]
    ]
    to_signal = [
        (row["signal_delivered_at"] - row["requested_at"]).total_seconds() * 1000
        for row in stop_rows
        if row["signal_delivered_at"]
    ]
    return {
        "period": {"since": since.isoformat(), "until": until.isoformat()},
        "stops": len(stop_rows),
        # A stop is counted as it ended: a dirty stop stays dirty here after a reviewer resolved
        # its unknowns (its outcome_state follows the run to clean; its dirty_reasons do not).
        "stopped_cleanly": sum(
            1
            for row in stop_rows
            if row["outcome_state"] == "stopped_cleanly" and not row["dirty_reasons"]
        ),
        "stopped_dirty": sum(1 for row in stop_rows if _ended_dirty(row)),
        "stopped_dirty_resolved": sum(
            1
            for row in stop_rows
            if _ended_dirty(row) and row["outcome_state"] == "stopped_cleanly"
        ),
        "stop_latency": {
            "to_stopped": latency_summary(to_stopped),
            "to_worker_signal": latency_summary(to_signal),
        },
        "side_effect_leakage": side_effect_leakage(since=since, until=until, team_ids=team_ids),
        "late_writes_rejected": team_filter(
            RejectedWrite.objects.filter(at__gte=since, at__lt=until), team_ids, "run__team_id"
        ).count(),
        "interruptions_recovered_cleanly": interruptions_recovered(
            since=since, until=until, team_ids=team_ids
        ),
        "handoff_completion": handoff_completion(since=since, until=until, team_ids=team_ids),
        "approvals": approval_figures(since=since, until=until, team_ids=team_ids),
        "late_spend": late_spend(stops),
    }


def late_spend(stops: QuerySet[StopRequest]) -> dict[str, Any]:
    """What the period's stops did not save: model calls of the stopped epoch reported after
    the stop request (what runs were about to spend is unknowable; this is measured). One
    query, the usage rows joined to their stop."""
    late = Usage.objects.filter(
        run__stop_requests__in=stops,
        epoch=F("run__stop_requests__epoch_before"),
        at__gt=F("run__stop_requests__requested_at"),
    )
    tokens = F("input_tokens") + F("output_tokens")
    totals = late.aggregate(
        cost=Sum("cost_usd"),
        tokens=Sum(tokens),
        unpriced=Sum(tokens, filter=Q(cost_usd__isnull=True)),
        calls=Count("pk"),
        runs=Count("run", distinct=True),
    )
    return {
        "cost_usd": float(totals["cost"] or 0),
        "tokens": totals["tokens"] or 0,
        "unpriced_tokens": totals["unpriced"] or 0,
        "calls": totals["calls"],
        "runs": totals["runs"],
    }


def handoff_completion(
    *, since: datetime, until: datetime, team_ids: list[int] | None = None
) -> dict[str, Any]:
    handoffs = team_filter(
        Handoff.objects.filter(created_at__gte=since, created_at__lt=until),
        team_ids,
        "run__team_id",
    )
    total = handoffs.count()
    done = handoffs.filter(
        status__in=(HandoffStatus.COMPLETED, HandoffStatus.RETURNED, HandoffStatus.CLOSED)
    ).count()
    return {"handoffs": total, "finished": done, "rate": (done / total) if total else None}


def _ended_dirty(row: dict[str, Any]) -> bool:
    return row["stopped_at"] is not None and (
        bool(row["dirty_reasons"]) or row["outcome_state"] == "stopped_dirty"
    )
