"""Reads over policies for the metrics and the console."""

from __future__ import annotations

from typing import Any

from django.db.models import Count

from policies.models import HitOutcome, Policy, PolicyHit


def hit_totals(*, team_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """Hits (acted and would-act) by team, policy and mode, for `/metrics`."""
    hits = PolicyHit.objects.filter(outcome__in=(HitOutcome.ACTED, HitOutcome.WOULD_ACT))
    if team_ids is not None:
        hits = hits.filter(team_id__in=team_ids)
    rows = (
        hits.values("team__slug", "policy_name", "mode")
        .annotate(hits=Count("id"))
        .order_by("team__slug", "policy_name", "mode")
    )
    return [dict(row) for row in rows]


def error_totals(*, team_ids: list[int] | None = None) -> list[dict[str, Any]]:
    policies = Policy.objects.all()
    if team_ids is not None:
        policies = policies.filter(team_id__in=team_ids)
    rows = policies.values("team__slug", "name", "errors_count").order_by("team__slug", "name")
    return [dict(row) for row in rows]
