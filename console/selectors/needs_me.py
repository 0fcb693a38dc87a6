"""The "needs me" page and the navigation's counts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import F, Func, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.utils import timezone

from console.access import Access
from handoff.models import Handoff, HandoffStatus
from runs.models import (
    UNCONFIRMED_SIDE_EFFECT,
    Approval,
    ApprovalStatus,
    ExecutionRecord,
    Lease,
    OutboxItem,
    Role,
    Run,
    RunStatus,
)
from runs.selectors import needs_resolution_q

# An approval this close to its deadline goes to the top: when it passes, the call is rejected.
NEEDS_ME_SOON = timedelta(minutes=10)


def _count(queryset: QuerySet[Any]) -> Subquery:
    """`SELECT COUNT(pk) … WHERE …` as a scalar subquery (COUNT as a plain function, so the
    subquery has no GROUP BY and always answers one row)."""
    return Subquery(queryset.order_by().annotate(n=Func(F("pk"), function="COUNT")).values("n"))


def _count_rows(queryset: QuerySet[Any]) -> Subquery:
    """`SELECT COUNT(*) …` as a scalar subquery: unlike COUNT(pk), it may be answered from an
    index alone (a run's status index has no id)."""
    counted = Func(template="COUNT(*)", output_field=IntegerField())
    return Subquery(queryset.order_by().annotate(n=counted).values("n"))


def _unknown_run_ids() -> RawSQL:
    """The ids of runs with an unknown (`runs.selectors.needs_resolution_q`): an unconfirmed
    write, an outbox item in flight, a worker fenced without confirming — read from the three
    small partial indexes, where asking each interrupted run in turn visited every one of them
    (20,000 at 1,000,000 runs: 380 ms, and 2.7 s more when PostgreSQL chose to JIT-compile)."""
    parts = [
        ExecutionRecord.objects.unconfirmed().values("run_id"),
        OutboxItem.objects.unconfirmed().values("run_id"),
        Lease.objects.filter(fenced_unconfirmed=True).values("run_id"),
    ]
    sqls: list[str] = []
    params: list[Any] = []
    for part in parts:
        sql, part_params = part.order_by().query.sql_with_params()
        sqls.append(sql)
        params.extend(part_params)
    return RawSQL(" UNION ".join(sqls), params)


def unresolved_interrupted(runs: QuerySet[Run]) -> QuerySet[Run]:
    """`runs` that are interrupted with an unknown: the same rows as
    `runs.filter(needs_resolution_q(), status=INTERRUPTED)`, found from the unknowns' side."""
    return runs.filter(status=RunStatus.INTERRUPTED, pk__in=_unknown_run_ids())


def _needs_runs(team_ids: list[int] | None) -> QuerySet[Run]:
    runs = Run.objects.filter(needs_resolution_q())
    return runs if team_ids is None else runs.filter(team_id__in=team_ids)


def _acting_runs(team_ids: list[int] | None) -> QuerySet[Run]:
    return Run.objects.all() if team_ids is None else Run.objects.filter(team_id__in=team_ids)


def _needs_handoffs(team_ids: list[int] | None, user_id: int | None) -> QuerySet[Handoff]:
    """Handoffs nobody has accepted yet, and the accepted ones that are this user's."""
    handoffs = Handoff.objects.filter(
        Q(status=HandoffStatus.OPEN) | Q(status=HandoffStatus.ACCEPTED, assignee_id=user_id)
    )
    return handoffs if team_ids is None else handoffs.filter(run__team_id__in=team_ids)


def _waiting_approvals(team_ids: list[int] | None) -> QuerySet[Approval]:
    approvals = Approval.objects.filter(status=ApprovalStatus.WAITING)
    return approvals if team_ids is None else approvals.filter(team_id__in=team_ids)


@dataclass(frozen=True)
class NavCounts:
    """The navigation's counts: waiting approvals of every team the user sees, and what needs
    a person on the teams where the user may act."""

    approvals_waiting: int = 0
    approvals: int = 0
    runs: int = 0
    handoffs: int = 0

    @property
    def needs_me(self) -> int:
        return self.approvals + self.runs + self.handoffs


def nav_counts(access: Access) -> NavCounts:
    """One query, whatever the number of teams: five scalar COUNT subqueries on the user's row
    (waiting approvals seen, waiting approvals to decide, dirty runs, unresolved interrupted runs,
    handoffs)."""
    if access.user_id is None:
        return NavCounts()
    acting = access.ids_with(Role.REVIEWER)
    row = (
        get_user_model()
        .objects.filter(pk=access.user_id)
        .annotate(
            approvals_waiting=_count(_waiting_approvals(access.team_ids)),
            needs_approvals=_count(_waiting_approvals(acting)),
            # `_needs_runs` as two counts: an OR of the two states reads every such run's row
            needs_dirty=_count_rows(_acting_runs(acting).filter(status=RunStatus.STOPPED_DIRTY)),
            needs_interrupted=_count_rows(unresolved_interrupted(_acting_runs(acting))),
            needs_handoffs=_count(_needs_handoffs(acting, access.user_id)),
        )
        .values(
            "approvals_waiting",
            "needs_approvals",
            "needs_dirty",
            "needs_interrupted",
            "needs_handoffs",
        )
        .first()
    )
    if row is None:
        return NavCounts()
    return NavCounts(
        approvals_waiting=row["approvals_waiting"] or 0,
        approvals=row["needs_approvals"] or 0,
        runs=(row["needs_dirty"] or 0) + (row["needs_interrupted"] or 0),
        handoffs=row["needs_handoffs"] or 0,
    )


@dataclass
class NeedsMeItem:
    """One thing waiting for a person; `kind` says which page decides it."""

    kind: str  # approval | stopped_dirty | interrupted | handoff
    tier: int  # 0 most urgent
    since: datetime  # when it started waiting
    run: Run
    approval: Approval | None = None
    handoff: Handoff | None = None
    unknowns: int = 0

    @property
    def sort_key(self) -> tuple[int, datetime]:
        return (self.tier, self.approval.deadline if self.approval else self.since)


# --------------------------------------------------------------------------------------------
# Needs me, grouped by kind: approvals (soonest deadline first), dirty stops, interrupted runs
# with unknowns, handoffs (oldest first) — each counted in full and shown a page at a time. The
# counts read the same querysets as `nav_counts`, so the navigation's badge and the list agree.

NEEDS_ME_KINDS = ("approval", "stopped_dirty", "interrupted", "handoff")
NEEDS_ME_GROUP_PAGE = 25


@dataclass(frozen=True)
class NeedsMeCounts:
    approval: int = 0
    stopped_dirty: int = 0
    interrupted: int = 0
    handoff: int = 0

    @property
    def total(self) -> int:
        return self.approval + self.stopped_dirty + self.interrupted + self.handoff

    def of(self, kind: str) -> int:
        return int(getattr(self, kind))


def needs_me_counts(access: Access) -> NeedsMeCounts:
    """What waits, per kind, on the teams where the user may act: one query."""
    if access.user_id is None:
        return NeedsMeCounts()
    acting = access.ids_with(Role.REVIEWER)
    if acting == []:
        return NeedsMeCounts()
    row = (
        get_user_model()
        .objects.filter(pk=access.user_id)
        .annotate(
            n_approval=_count(_waiting_approvals(acting)),
            n_dirty=_count_rows(_acting_runs(acting).filter(status=RunStatus.STOPPED_DIRTY)),
            n_interrupted=_count_rows(unresolved_interrupted(_acting_runs(acting))),
            n_handoff=_count(_needs_handoffs(acting, access.user_id)),
        )
        .values("n_approval", "n_dirty", "n_interrupted", "n_handoff")
        .first()
    )
    if row is None:
        return NeedsMeCounts()
    return NeedsMeCounts(
        approval=row["n_approval"] or 0,
        stopped_dirty=row["n_dirty"] or 0,
        interrupted=row["n_interrupted"] or 0,
        handoff=row["n_handoff"] or 0,
    )


def _needs_me_runs(acting: list[int] | None, kind: str) -> QuerySet[Run]:
    runs = _acting_runs(acting)
    if kind == "stopped_dirty":
        return runs.filter(status=RunStatus.STOPPED_DIRTY)
    return unresolved_interrupted(runs)


def needs_me_group(
    access: Access, kind: str, *, offset: int = 0, limit: int = NEEDS_ME_GROUP_PAGE
) -> list[NeedsMeItem]:
    """One kind's items, a page of them: approvals by deadline (the soonest first, those within
    NEEDS_ME_SOON urgent), the others oldest first. One query (two for runs: their unknowns
    are counted in the same query)."""
    acting = access.ids_with(Role.REVIEWER)
    if acting == [] or kind not in NEEDS_ME_KINDS:
        return []
    now = timezone.now()
    window = slice(offset, offset + limit)
    if kind == "approval":
        approvals = _waiting_approvals(acting).select_related("run", "team")
        return [
            NeedsMeItem(
                "approval",
                0 if approval.deadline - now <= NEEDS_ME_SOON else 2,
                approval.requested_at,
                approval.run,
                approval=approval,
            )
            for approval in approvals.order_by("deadline", "pk")[window]
        ]
    if kind == "handoff":
        handoffs = _needs_handoffs(acting, access.user_id).select_related(
            "run", "run__team", "assignee"
        )
        return [
            NeedsMeItem("handoff", 3, handoff.created_at, handoff.run, handoff=handoff)
            for handoff in handoffs.order_by("created_at", "pk")[window]
        ]
    unknown_calls = ExecutionRecord.objects.filter(UNCONFIRMED_SIDE_EFFECT, run=OuterRef("pk"))
    unknown_items = OutboxItem.objects.unconfirmed().filter(run=OuterRef("pk"))
    runs: list[Any] = list(
        _needs_me_runs(acting, kind)
        .select_related("team")
        .annotate(
            unknown_calls=_count(unknown_calls),
            unknown_items=_count(unknown_items),
            waiting_since=Coalesce("stopped_at", "updated_at"),
        )
        .order_by("waiting_since", "pk")[window]
    )
    return [
        NeedsMeItem(
            kind,
            1,
            run.waiting_since,
            run,
            unknowns=(run.unknown_calls or 0) + (run.unknown_items or 0),
        )
        for run in runs
    ]
