"""The stop-quality page: its time series."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.db.models.functions import TruncDay, TruncHour

from runs.models import (
    RejectedWrite,
    RunStatus,
    StopRequest,
)

LATENCY_BUCKETS_MS = (10, 50, 100, 250, 500, 1_000, 5_000, 30_000)


@dataclass
class QualitySeries:
    latency_histogram: list[tuple[str, int]]
    outcomes: list[tuple[datetime, int, int]]  # (bucket start, stopped_cleanly, stopped_dirty)
    late_writes: list[tuple[datetime, int]]
    bucket: str  # "hour" | "day"


def _bucket_label(upper: int | None, lower: int) -> str:
    def fmt(ms: int) -> str:
        return f"{ms // 1000}s" if ms >= 1000 else f"{ms}ms"

    return f"≥{fmt(lower)}" if upper is None else f"<{fmt(upper)}"


def quality_series(
    *, since: datetime, until: datetime, team_ids: list[int] | None
) -> QualitySeries:
    """The data behind the charts (three queries): latency histogram, outcomes and late writes over time."""
    stops = StopRequest.objects.filter(requested_at__gte=since, requested_at__lt=until)
    late = RejectedWrite.objects.filter(at__gte=since, at__lt=until)
    if team_ids is not None:
        stops = stops.filter(run__team_id__in=team_ids)
        late = late.filter(run__team_id__in=team_ids)
    hourly = (until - since) <= timedelta(days=2)
    trunc = TruncHour if hourly else TruncDay
    rows = list(stops.values_list("requested_at", "stopped_at", "outcome_state"))
    histogram = Counter[int]()
    for requested_at, stopped_at, _outcome in rows:
        if stopped_at is None:
            continue
        ms = (stopped_at - requested_at).total_seconds() * 1000
        index = next(
            (i for i, upper in enumerate(LATENCY_BUCKETS_MS) if ms < upper), len(LATENCY_BUCKETS_MS)
        )
        histogram[index] += 1
    labels = [_bucket_label(upper, 0) for upper in LATENCY_BUCKETS_MS] + [
        _bucket_label(None, LATENCY_BUCKETS_MS[-1])
    ]
    # As the stop ended (handoff.selectors.stop_quality): resolving a dirty stop later does not
    # turn it clean here.
    ended_dirty = Q(stopped_at__isnull=False) & (
        ~Q(dirty_reasons=[]) | Q(outcome_state=RunStatus.STOPPED_DIRTY)
    )
    outcome_rows = (
        stops.annotate(bucket=trunc("requested_at"))
        .values("bucket")
        .annotate(
            n_clean=Count(
                "pk", filter=Q(outcome_state=RunStatus.STOPPED_CLEANLY, dirty_reasons=[])
            ),
            n_dirty=Count("pk", filter=ended_dirty),
        )
    )
    outcomes: dict[datetime, list[int]] = {}
    for row in outcome_rows:
        pair = outcomes.setdefault(row["bucket"], [0, 0])
        pair[0] += row["n_clean"]
        pair[1] += row["n_dirty"]
    late_rows = late.annotate(bucket=trunc("at")).values("bucket").annotate(n=Count("pk"))
    return QualitySeries(
        latency_histogram=[(labels[i], histogram.get(i, 0)) for i in range(len(labels))],
        outcomes=_fill(
            since, until, hourly, {key: (value[0], value[1]) for key, value in outcomes.items()}
        ),
        late_writes=[
            (start, count)
            for start, count, _unused in _fill(
                since, until, hourly, {row["bucket"]: (row["n"], 0) for row in late_rows}
            )
        ],
        bucket="hour" if hourly else "day",
    )


def _fill(
    since: datetime, until: datetime, hourly: bool, values: dict[datetime, tuple[int, int]]
) -> list[Any]:
    """Every bucket of the period, with zeros where nothing happened (charts need the gaps)."""
    step = timedelta(hours=1) if hourly else timedelta(days=1)
    start = since.replace(minute=0, second=0, microsecond=0)
    if not hourly:
        start = start.replace(hour=0)
    out: list[tuple[datetime, int, int]] = []
    cursor = start
    while cursor < until and len(out) < 400:
        value = values.get(cursor, (0, 0))
        out.append((cursor, value[0], value[1]))
        cursor += step
    return out
