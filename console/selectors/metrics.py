"""Console figures for the metrics endpoint (`console/metrics.py`)."""

from __future__ import annotations

from datetime import datetime

from axes.models import AccessFailureLog

from runs.models import (
    Team,
)


def login_failures(*, since: datetime) -> dict[str, int]:
    """Failed console sign-ins since `since`, and how many of them met a lockout."""
    rows = AccessFailureLog.objects.filter(attempt_time__gte=since)
    return {"failed": rows.count(), "locked_out": rows.filter(locked_out=True).count()}


def team_slugs(*, team_ids: list[int]) -> list[str]:
    return list(Team.objects.filter(pk__in=team_ids).values_list("slug", flat=True))
