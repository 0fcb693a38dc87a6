"""Read queries over runs records shared by the API, the console and the metrics endpoint.

Figures that also count handoffs (`stop_quality`) are in `handoff.selectors`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import (
    BooleanField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    TextField,
)
from django.db.models.functions import Cast, Left, Length
from django.utils import timezone
from django.utils.translation import gettext

from runs import frozen
from runs.actors import Actor
from runs.budgets import (
    budget_exceeded,
    period_at,
    team_budget_note,
    team_budget_roll,
    team_budget_states,
)
from runs.errors import NotFound, PreviewExpired
from runs.labels import label_for
from runs.models import (
    STOPPING_STATUSES,
    Approval,
    ApprovalRule,
    ApprovalStatus,
    BulkStopOutcome,
    BulkStopPreview,
    ExecutionRecord,
    Lease,
    LedgerEntry,
    OutboxItem,
    Run,
    RunStatus,
    TeamBudget,
    Usage,
)
from runs.sql import OnceCompiled


def percentile(values: list[float], fraction: float) -> float | None:
    """Nearest-rank percentile; None for no samples."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, int(round(fraction * len(ordered) + 0.5)) - 1))
    return ordered[rank]


def latency_summary(samples_ms: list[float]) -> dict[str, Any]:
    return {
        "count": len(samples_ms),
        "p50_ms": percentile(samples_ms, 0.50),
        "p95_ms": percentile(samples_ms, 0.95),
        "p99_ms": percentile(samples_ms, 0.99),
    }


def team_filter(queryset: QuerySet[Any], team_ids: list[int] | None, path: str) -> QuerySet[Any]:
    return queryset if team_ids is None else queryset.filter(**{f"{path}__in": team_ids})


def side_effect_leakage(
    *, since: datetime, until: datetime, team_ids: list[int] | None = None
) -> dict[str, int]:
    """Permits or dispatch claims that started after a stop of their epoch was recorded (must be 0)."""
    permits = (
        team_filter(
            ExecutionRecord.objects.filter(
                run__stop_requests__epoch_before=F("permit_epoch"),
                run__stop_requests__requested_at__lt=F("permitted_at"),
                permitted_at__gte=since,
                permitted_at__lt=until,
            ),
            team_ids,
            "run__team_id",
        )
        .distinct()
        .count()
    )
    dispatches = (
        team_filter(
            OutboxItem.objects.filter(
                run__stop_requests__epoch_before=F("claim_epoch"),
                run__stop_requests__requested_at__lt=F("claimed_at"),
                claimed_at__gte=since,
                claimed_at__lt=until,
            ),
            team_ids,
            "run__team_id",
        )
        .distinct()
        .count()
    )
    return {
        "permits_after_stop": permits,
        "dispatches_after_stop": dispatches,
        "total": permits + dispatches,
    }


def interruptions_recovered(
    *, since: datetime, until: datetime, team_ids: list[int] | None = None
) -> dict[str, Any]:
    """Of runs interrupted in the period, the share whose interruption ended cleanly (DESIGN §7).

    A run's first interruption in the period ends at the first of: a resume (which the server
    allows only once every unknown the interruption left is resolved), a clean stop, or a dirty
    stop. The first two are a clean recovery; a dirty stop is not, whatever is resolved after
    it. What a later round does (a stop after the resume) is that round's, not the
    interruption's. An interruption that has not ended yet is not recovered.
    """
    interrupted = team_filter(
        LedgerEntry.objects.filter(action="run.interrupted", at__gte=since, at__lt=until),
        team_ids,
        "run__team_id",
    )
    firsts: dict[str, Any] = {}
    for run_id, run_seq in interrupted.order_by("run_seq").values_list("run_id", "run_seq"):
        firsts.setdefault(run_id, run_seq)
    endings: dict[str, str] = {}
    if firsts:
        later = (
            LedgerEntry.objects.filter(
                run_id__in=list(firsts),
                action__in=("run.stopped_cleanly", "run.stopped_dirty", "run.resume"),
            )
            .order_by("run_seq")
            .values_list("run_id", "action", "run_seq")
        )
        for run_id, action, run_seq in later:
            if run_seq > firsts[run_id]:
                endings.setdefault(run_id, action)
    recovered = sum(
        1 for action in endings.values() if action in ("run.resume", "run.stopped_cleanly")
    )
    total = len(firsts)
    return {
        "interrupted": total,
        "recovered_cleanly": recovered,
        "rate": (recovered / total) if total else None,
    }


def needs_resolution_q() -> Q:
    """Runs a person must decide something on before anything else may happen to them: stopped
    dirty, or interrupted with an unknown — an unconfirmed write, an outbox item in flight, a
    worker fenced without confirming (the dirty reasons of `run_dirty_reasons`; DESIGN §2:
    resume is refused while one holds)."""
    run = OuterRef("pk")
    unknown = (
        Q(Exists(ExecutionRecord.objects.filter(run=run).unconfirmed()))
        | Q(Exists(OutboxItem.objects.filter(run=run).unconfirmed()))
        | Q(Exists(Lease.objects.filter(run=run, fenced_unconfirmed=True)))
    )
    return Q(status=RunStatus.STOPPED_DIRTY) | (Q(status=RunStatus.INTERRUPTED) & unknown)


def runs_for_teams(team_ids: list[int] | None) -> QuerySet[Run]:
    runs = Run.objects.select_related("team")
    return runs if team_ids is None else runs.filter(team_id__in=team_ids)


def queue_depths(*, team_ids: list[int] | None = None) -> dict[str, int]:
    """Gauges for /metrics: work waiting in each queue (one team's, or every team's for None).

    Two aggregate queries, one per table, instead of a COUNT per gauge.
    """
    outbox_states = ("pending", "dispatching", "frozen", "unknown")
    # A pending item below its run's epoch is frozen (`runs.frozen`): counted there.
    by_state = {
        **{state: Q(status=state) for state in outbox_states},
        "pending": frozen.pending_q(),
        "frozen": frozen.frozen_q(),
    }
    outbox = team_filter(
        OutboxItem.objects.filter(status__in=outbox_states), team_ids, "run__team_id"
    ).aggregate(
        **{f"outbox_{state}": Count("pk", filter=by_state[state]) for state in outbox_states}
    )
    # status IN (...) lets PostgreSQL use run_status_created_idx instead of reading every run
    run_states = ("cancel_requested", "draining", "stopped_dirty")
    runs = team_filter(Run.objects.filter(status__in=run_states), team_ids, "team_id").aggregate(
        runs_stopping=Count("pk", filter=Q(status__in=run_states[:2])),
        runs_stopped_dirty=Count("pk", filter=Q(status="stopped_dirty")),
    )
    return {**outbox, **runs}


# --------------------------------------------------------------------------------------------
# approvals (DESIGN §10)


def approval_rules_list(
    *, team_ids: list[int] | None, team_slug: str = ""
) -> QuerySet[ApprovalRule]:
    """The teams' rules in the order they are tried (team, then `position`, then age)."""
    rules = team_filter(ApprovalRule.objects.all(), team_ids, "team_id")
    if team_slug:
        rules = rules.filter(team__slug=team_slug)
    return rules.select_related("team").order_by("team__slug", "position", "id")


def approvals_list(
    *,
    team_ids: list[int] | None,
    status: str = "waiting",
    agent: str = "",
    tool: str = "",
    risk: str = "",
    run_id: str = "",
) -> QuerySet[Approval]:
    """The inbox and the API list: waiting ones soonest deadline first, decided ones newest
    first. Filters are exact except `tool` (a substring of what is held: the tool name, or the
    outbox transport and destination). Uses the partial `approval_*waiting_idx` indexes."""
    approvals = team_filter(Approval.objects.all(), team_ids, "team_id")
    if status:
        approvals = approvals.filter(status=status)
    if agent:
        approvals = approvals.filter(agent=agent)
    if tool:
        approvals = approvals.filter(subject__icontains=tool)
    if risk:
        approvals = approvals.filter(risk=risk)
    if run_id:
        approvals = approvals.filter(run_id=run_id)
    order = ("deadline", "id") if status == ApprovalStatus.WAITING else ("-requested_at", "-id")
    return approvals.select_related("run", "team", "execution_record", "outbox_item").order_by(
        *order
    )


def approvals_summarised(approvals: QuerySet[Approval], *, chars: int) -> QuerySet[Approval]:
    """A list's approvals without their arguments: each row carries the first `chars`
    characters of its arguments' JSON text (`arguments_head`) and its length
    (`arguments_chars`), cut by the database, so a page of approvals with megabytes of
    arguments each is read and answered in bounded memory. The detail has them whole."""
    text = Cast("arguments", output_field=TextField())
    return approvals.defer(
        "original_arguments",
        "arguments",
        "arguments_schema",
        "execution_record__arguments",
        "outbox_item__payload",
    ).annotate(
        arguments_head=Left(text, chars + 1),
        arguments_chars=Length(text),
        has_arguments_schema=ExpressionWrapper(
            Q(arguments_schema__isnull=False), output_field=BooleanField()
        ),
    )


def approvals_waiting_count(*, team_ids: list[int] | None) -> int:
    return team_filter(
        Approval.objects.filter(status=ApprovalStatus.WAITING), team_ids, "team_id"
    ).count()


def approvals_waiting_by_run(run_ids: list[str]) -> dict[str, int]:
    """For the runs page: how many approvals each listed run is waiting on (one query)."""
    rows = (
        Approval.objects.filter(run_id__in=run_ids, status=ApprovalStatus.WAITING)
        .values("run_id")
        .annotate(n=Count("id"))
    )
    return {row["run_id"]: row["n"] for row in rows}


def approval_figures(
    *, since: datetime, until: datetime, team_ids: list[int] | None = None
) -> dict[str, Any]:
    """Time to decision (by a person: approved or rejected) and the outcome counts, for
    approvals requested in [since, until)."""
    approvals = team_filter(
        Approval.objects.filter(requested_at__gte=since, requested_at__lt=until),
        team_ids,
        "team_id",
    )
    rows = list(approvals.values("status", "edited", "requested_at", "decided_at"))
    decided_ms = [
        (row["decided_at"] - row["requested_at"]).total_seconds() * 1000
        for row in rows
        if row["decided_at"] and row["status"] in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED)
    ]
    counts = {status: 0 for status in ApprovalStatus.values}
    for row in rows:
        counts[row["status"]] += 1
    return {
        "requested": len(rows),
        "time_to_decision": latency_summary(decided_ms),
        "approved": counts[ApprovalStatus.APPROVED],
        "approved_with_edits": sum(
            1 for row in rows if row["status"] == ApprovalStatus.APPROVED and row["edited"]
        ),
        "rejected": counts[ApprovalStatus.REJECTED],
        "expired": counts[ApprovalStatus.EXPIRED],
        "void": counts[ApprovalStatus.VOID],
        "waiting": counts[ApprovalStatus.WAITING],
    }


def bulk_run_statuses(results: Any) -> dict[str, str]:
    """Each bulk-stop result's run and its status now, in one query (for `bulk_result_state`)."""
    run_ids = [result.run_id for result in results]
    return dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "status"))


def usage_totals(*, team_ids: list[int] | None = None) -> list[dict[str, Any]]:
    """For /metrics: every usage row ever kept, summed per (team, agent, model): `cost` (None
    when every call of the group was unpriced), `unpriced` tokens, and the four token counts.
    One aggregate query."""
    tokens = F("input_tokens") + F("output_tokens")
    return list(
        team_filter(Usage.objects.all(), team_ids, "run__team_id")
        .values(team=F("run__team__slug"), agent=F("run__agent"), model_name=F("model"))
        .annotate(
            cost=Sum("cost_usd"),
            unpriced=Sum(tokens, filter=Q(cost_usd__isnull=True), default=0),
            input=Sum("input_tokens"),
            output=Sum("output_tokens"),
            cache_read=Sum("cache_read_tokens"),
            cache_write=Sum("cache_write_tokens"),
        )
        .order_by("team", "agent", "model_name")
    )


def usage_by_model(*, run_id: str) -> QuerySet[Any, Any]:
    """One run's calls per model (lazy: one query, when read): `cost` None when every call of
    that model was unpriced."""
    tokens = F("input_tokens") + F("output_tokens")
    return (
        Usage.objects.filter(run_id=run_id)
        .values("model")
        .annotate(
            calls=Count("pk"),
            cost=Sum("cost_usd"),
            input=Sum("input_tokens"),
            output=Sum("output_tokens"),
            unpriced=Sum(tokens, filter=Q(cost_usd__isnull=True), default=0),
        )
        .order_by("model")
    )


def usage_by_step(*, run_id: str) -> QuerySet[Any, Any]:
    """One run's calls per step (`step_key`; blank: calls reported without a step), in the
    order the steps first spent: `cost` None when every call of that step was unpriced."""
    tokens = F("input_tokens") + F("output_tokens")
    return (
        Usage.objects.filter(run_id=run_id)
        .values("step_key")
        .annotate(
            calls=Count("pk"),
            cost=Sum("cost_usd"),
            input=Sum("input_tokens"),
            output=Sum("output_tokens"),
            unpriced=Sum(tokens, filter=Q(cost_usd__isnull=True), default=0),
            first=Min("at"),
        )
        .order_by("first", "step_key")
    )


# --------------------------------------------------------------------------------------------
# reads the transitions share with their callers (the console's Resume, the sweeps)


# In this order in the answer (the packet and the ledger keep it).
DIRTY_REASONS = ("unconfirmed_side_effects", "outbox_in_flight", "worker_unconfirmed")


def _dirty_reasons_query(run_id: str) -> QuerySet[Any]:
    return (
        Run.objects.filter(pk=run_id)
        .annotate(
            unconfirmed_side_effects=Exists(
                ExecutionRecord.objects.filter(run_id=run_id).unconfirmed()
            ),
            outbox_in_flight=Exists(OutboxItem.objects.filter(run_id=run_id).unconfirmed()),
            worker_unconfirmed=Exists(Lease.objects.filter(run_id=run_id, fenced_unconfirmed=True)),
        )
        .values(*DIRTY_REASONS)
    )


# One statement, compiled once per process: every settle asks it under the run lock.
DIRTY_REASONS_READ = OnceCompiled(_dirty_reasons_query, "run_sample_5afe")


def run_dirty_reasons(run: Run) -> list[str]:
    """What is still unknown about this run's side effects (empty means clean)."""
    return dirty_reasons_from(DIRTY_REASONS_READ.rows(run.pk))


def dirty_reasons_from(rows: list[dict[str, Any]]) -> list[str]:
    """`run_dirty_reasons` from the rows of `DIRTY_REASONS_READ`."""
    return [reason for reason in DIRTY_REASONS if rows and rows[0][reason]]


def resume_blocked_reason(status: str, reasons: list[str]) -> str:
    """Why a run with these dirty reasons cannot resume: the server's refusal and the console's
    disabled Resume say the same words (DESIGN §2: resume is refused while a reason holds)."""
    what = ", ".join(label_for(reason) for reason in reasons)
    if status == RunStatus.INTERRUPTED:
        return gettext("resolve the interruption's unknowns before resuming (%(what)s)") % {
            "what": what
        }
    return gettext("resolve the run's unknown side effects before resuming it (%(what)s)") % {
        "what": what
    }


def approvals_due_ids(
    *, now: datetime | None = None, limit: int = 500
) -> tuple[list[int], list[int]]:
    """(expired, to escalate): the sweep's candidates, read without locks (each is re-checked)."""
    now = now or timezone.now()
    expired = list(
        Approval.objects.filter(status=ApprovalStatus.WAITING, deadline__lte=now)
        .order_by("deadline")
        .values_list("pk", flat=True)[:limit]
    )
    escalate = list(
        Approval.objects.filter(
            status=ApprovalStatus.WAITING, escalated_at__isnull=True, escalate_at__lte=now
        )
        .order_by("escalate_at")
        .values_list("pk", flat=True)[:limit]
    )
    return expired, escalate


def runs_over_budget_ids() -> list[str]:
    """Candidates for the budget enforcer (the enforcer re-checks each under its lock)."""
    running = Run.objects.filter(status=RunStatus.RUNNING).filter(
        Q(max_seconds__isnull=False)
        | Q(max_tool_calls__isnull=False)
        | Q(max_cost_usd__isnull=False)
        | Q(max_tokens__isnull=False)
    )
    now = timezone.now()
    ids = []
    for run in running.only(
        "id",
        "max_seconds",
        "max_tool_calls",
        "tool_calls_count",
        "started_at",
        "max_cost_usd",
        "max_tokens",
        "cost_usd",
        "input_tokens",
        "output_tokens",
    ):
        if budget_exceeded(run, now=now):
            ids.append(run.pk)
    return ids


def runs_with_frozen_by_epoch(*, limit: int = 100, run_id: str | None = None) -> list[str]:
    """Runs with rows still to relabel (the safety net's scan: pending rows are few, and walked
    through `outbox_pending_idx`)."""
    rows = OutboxItem.objects.filter(frozen.frozen_by_epoch_q())
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    return list(rows.order_by().values_list("run_id", flat=True).distinct()[:limit])


def team_budget_spent(team_id: int, *, now: datetime) -> TeamBudget | None:
    """The team's budget with its counters as of `now` (a period that ended reads zero)."""
    budget = TeamBudget.objects.filter(pk=team_id).first()
    if budget is not None:
        team_budget_roll(budget, period_at(budget.time_zone, now))
    return budget


def team_budget_refusal(team_id: int, *, now: datetime) -> tuple[str, str]:
    """The permit's hook: (budget name, note) when the team's spend in the current period has reached a budget,
    else ("", ""). Read without a lock: the batch that reached it already stopped its run, and
    a permit that reads a moment too early is one call in flight, which the bound counts."""
    budget = TeamBudget.objects.filter(pk=team_id).first()
    if budget is None or (budget.daily_usd is None and budget.monthly_usd is None):
        return "", ""
    team_budget_roll(budget, period_at(budget.time_zone, now))
    for name, limit, spent, _period, _warned in team_budget_states(budget):
        if limit is not None and spent >= limit:
            return name, team_budget_note(budget, name)
    return "", ""


# --------------------------------------------------------------------------------------------
# bulk stops: a recorded preview, and what a result says now

# A confirm must follow its preview within this many seconds (SAFESTOP_BULK_PREVIEW_SECONDS):
# after that the reviewer previews again rather than act on a picture of the fleet gone stale.
DEFAULT_BULK_PREVIEW_SECONDS = 600


def bulk_preview_seconds() -> int:
    return int(getattr(settings, "SAFESTOP_BULK_PREVIEW_SECONDS", DEFAULT_BULK_PREVIEW_SECONDS))


def bulk_preview_get(*, actor: Actor, preview_id: str) -> BulkStopPreview:
    """The caller's own recorded preview, still fresh enough to confirm.

    Another caller's preview is "not found" like one that never existed: a preview is what one
    reviewer saw, not a handle anyone may act on."""
    preview = BulkStopPreview.objects.filter(
        preview_id=preview_id, actor_kind=actor.kind, actor_id=actor.id
    ).first()
    if preview is None:
        raise NotFound("no such preview of yours; preview again", field="preview_id")
    age = (timezone.now() - preview.created_at).total_seconds()
    if age > bulk_preview_seconds():
        raise PreviewExpired(
            f"this preview is {int(age)} s old (a confirm must follow within "
            f"{bulk_preview_seconds()} s); preview again",
            preview_id=preview_id,
        )
    return preview


def bulk_result_state(outcome: str, run_status: str | None) -> str:
    """What a result says now: a stop that was requested is `requested` until its run reaches
    an end state, then that state (a dirty stop is `stopped_dirty`: it needs resolution).

    The stop service only records the request; the run drains afterwards, and "stopped" while
    the worker is still draining would claim an outcome nobody knows yet."""
    if outcome != BulkStopOutcome.STOPPED or run_status is None:
        return outcome
    if run_status in STOPPING_STATUSES:
        return "requested"
    # stopped_cleanly, stopped_dirty, handed_off — or, later, whatever a person did next
    # (resumed, closed): the run's own state is the honest answer.
    return run_status
