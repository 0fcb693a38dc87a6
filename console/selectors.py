"""Read queries for the console pages. Each page makes a fixed number of queries, whatever the
number of rows: lists are fetched in one query each and joined in Python, never per row."""

from __future__ import annotations

import base64
import binascii
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

from axes.models import AccessFailureLog
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Count, F, Func, IntegerField, OuterRef, Q, QuerySet, Subquery, Window
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce, TruncDay, TruncHour
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.access import Access
from console.converters import RunIdConverter
from handoff.models import Handoff, HandoffStatus, Resolution, StopPacket
from handoff.packets import interruption_packet
from runs import frozen
from runs.access import ROLE_CAPABILITIES, Capability
from runs.ledger_queries import LedgerFilters, ledger_entries
from runs.models import (
    OUTBOX_IN_FLIGHT_STATUSES,
    UNCONFIRMED_SIDE_EFFECT,
    ApiToken,
    Approval,
    ApprovalStatus,
    Artifact,
    Checkpoint,
    ExecutionRecord,
    Lease,
    LedgerEntry,
    Membership,
    OutboxItem,
    OutboxStatus,
    RejectedWrite,
    Role,
    Run,
    RunStatus,
    SteeringMessage,
    SteeringStatus,
    Step,
    StepStatus,
    StopRequest,
    Team,
    is_unconfirmed_side_effect,
)
from runs.selectors import needs_resolution_q

RUNS_PAGE_SIZE = 50
RUN_LEDGER_LIMIT = 200
# The run page shows the newest steps and tool calls (and every unresolved call, whatever its
# age): rendering 5,000 steps took a second (docs/BENCHMARKS.md). "Show all" lifts the window.
RUN_STEP_WINDOW = 200
# Outbox items that went out (or were discarded) and artifacts are history too: the newest
# RUN_HISTORY_WINDOW of each. An item still open — held, pending, in flight, unknown, failed,
# frozen or released — is always shown, whatever its age. (The page of a run with 300 of each
# spent most of its time rendering them, docs/BENCHMARKS.md.)
RUN_HISTORY_WINDOW = 100
OUTBOX_SETTLED = (OutboxStatus.SENT, OutboxStatus.DISCARDED)
# The stop packet page likewise shows the newest completed steps, tool calls and artifacts of the
# snapshot; pending steps, unknowns and frozen or in-flight outbox items are always shown whole.
# A 5,000-step packet rendered in ~430 ms p95 (docs/BENCHMARKS.md). "Show all" lifts the window.
PACKET_WINDOW = 200
AUDIT_PAGE_SIZE = 100


# --------------------------------------------------------------------------------------------
# runs page: filters, counts per state, keyset pagination on (created_at, id)


def cursor_encode(created_at: datetime, run_id: str) -> str:
    raw = f"{created_at.isoformat()}|{run_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_decode(value: str) -> tuple[datetime, str] | None:
    """A tampered or stale cursor is ignored (first page), never a 500: its two parts go into a
    query, so each must be what `cursor_encode` writes — an aware datetime PostgreSQL can
    compare (an impossible date, a naive one or an offset past ±15:59 is not) and a run id
    (a NUL byte is not)."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
        stamp, run_id = raw.split("|", 1)
        created_at = parse_datetime(stamp)  # ValueError: well formed but impossible
        if created_at is None or timezone.is_naive(created_at):
            return None
        created_at = created_at.astimezone(UTC)  # OverflowError: past the calendar's ends
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        return None
    if not re.fullmatch(RunIdConverter.regex, run_id):
        return None
    return created_at, run_id


@dataclass
class RunFilters:
    status: str = ""
    agent: str = ""
    team: str = ""  # team slug
    q: str = ""
    after: str = ""  # cursor: older than this row
    before: str = ""  # cursor: newer than this row

    @property
    def active(self) -> bool:
        return bool(self.status or self.agent or self.team or self.q)


@dataclass
class RunsPage:
    rows: list[Run]
    counts: dict[str, int]
    total: int
    has_newer: bool
    has_older: bool
    newer_cursor: str = ""
    older_cursor: str = ""
    agents: list[str] = field(default_factory=list)
    teams: list[Team] = field(default_factory=list)
    needs_resolution: int = 0  # stopped dirty
    # interrupted with an unknown (`runs.selectors.needs_resolution_q`): how many, which rows
    interrupted_unresolved: int = 0
    unresolved_ids: set[str] = field(default_factory=set)
    # the states whose count reached its cap: the page says "1000+", not the exact figure
    capped: set[str] = field(default_factory=set)
    interrupted_capped: bool = False

    @property
    def total_capped(self) -> bool:
        return bool(self.capped)


# Counting a million runs per state is a scan of every one of them (650 ms at 1,000,000 runs,
# docs/BENCHMARKS.md), on every refresh of every viewer. Each state's count stops at this
# many; past it the page says "1000+". A count below the cap is exact. 10,000 cost 4-6 times
# as much as 1,000 (64-80 ms against 11-19 ms at load 19 on 2 cores).
RUNS_COUNT_CAP = 1_000
# A search counts the states of its newest matches only, this many (see `_sampled_counts`):
# a common word's 1,001 newest matches sat on 8,500 heap pages at 1,000,000 runs (0.2-1 s
# when they are not in shared buffers), its 201 newest on a fifth of that.
SEARCH_COUNT_CAP = 200
# A hex fragment may be part of a run id (`run_` + hex); other words are searched in titles only.
_ID_FRAGMENT = re.compile(r"[0-9a-fA-F]{3,}")


def _scoped_runs(access: Access) -> QuerySet[Run]:
    runs = Run.objects.all()
    return runs if access.all_teams else runs.filter(team_id__in=access.team_ids or [])


def _search(runs: QuerySet[Run], q: str) -> QuerySet[Run]:
    q = q.strip()
    if not q:
        return runs
    if q.startswith("run_"):
        # Ids are lower case (`new_run_id`): a case-sensitive prefix uses the primary key's
        # pattern index where UPPER(id) LIKE would read every run.
        return runs.filter(pk__startswith=q.lower())
    if _ID_FRAGMENT.fullmatch(q):
        return runs.filter(Q(title__icontains=q) | Q(pk__contains=q.lower()))
    return runs.filter(title__icontains=q)


def _capped_counts(narrowed: QuerySet[Run], cap: int) -> dict[str, int]:
    """Runs per state, each counted up to `cap` + 1 — one query whatever the number of runs.

    One scalar subquery per state, `SELECT COUNT(*) FROM (… LIMIT cap + 1)`: each reads at
    most cap + 1 entries of a (status, …) index, where GROUP BY status reads every run.
    Plain SQL that PostgreSQL and SQLite both run."""
    parts: list[str] = []
    params: list[Any] = []
    for state in RunStatus.values:
        limited = narrowed.filter(status=state).order_by().values("status")[: cap + 1]
        sql, sql_params = limited.query.sql_with_params()
        parts.append(f"(SELECT COUNT(*) FROM ({sql}) AS capped)")
        params.extend(sql_params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        row = cursor.fetchone()
    return {state: n for state, n in zip(RunStatus.values, row, strict=True) if n}


def _sampled_counts(narrowed: QuerySet[Run], cap: int) -> tuple[dict[str, int], set[str]]:
    """Runs per state among the newest `cap` matches of a search: exact when the search
    matches no more than `cap` runs; past it every state is "at least" (all are capped).

    Counting a common word state by state read its 100,000 matches twelve times (4 s at
    1,000,000 runs); the newest matches are what the page lists anyway, and PostgreSQL picks
    the created-at index for a common word and the trigram index for a rare one."""
    newest = list(narrowed.order_by("-created_at").values_list("status", flat=True)[: cap + 1])
    counts = dict(Counter(newest[:cap]))
    return counts, set(RunStatus.values) if len(newest) > cap else set()


def _agents(access: Access, limit: int = 200) -> list[str]:
    """The distinct agents, in order: a loose index scan over `run_agent_status_team_idx` (one
    index probe per agent) where DISTINCT read every run (600 ms at 1,000,000). Recursive CTEs run on
    PostgreSQL and SQLite alike."""
    table = connection.ops.quote_name(Run._meta.db_table)
    scope, params = "", []
    if not access.all_teams:
        team_ids = list(access.team_ids or [])
        if not team_ids:
            return []
        scope = f" AND team_id IN ({', '.join(['%s'] * len(team_ids))})"
        params = team_ids
    sql = (
        "WITH RECURSIVE agents(name) AS ("
        f" SELECT MIN(agent) FROM {table} WHERE 1 = 1{scope}"
        " UNION ALL"
        f" SELECT (SELECT MIN(agent) FROM {table} WHERE agent > agents.name{scope})"
        " FROM agents WHERE agents.name IS NOT NULL"
        f") SELECT name FROM agents WHERE name IS NOT NULL LIMIT {int(limit)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params * 2)
        return [name for (name,) in cursor.fetchall()]


def runs_page(
    access: Access,
    filters: RunFilters,
    *,
    teams: list[Team],
    size: int = RUNS_PAGE_SIZE,
    count_cap: int | None = None,
) -> RunsPage:
    """Five queries at most: agents, counts per state, the page (+1 row to know if there is
    more), and the unresolved interrupted runs when there are some — however many runs.

    Counts ignore the status filter so the state chips always show the whole picture of what
    the other filters select.
    """
    count_cap = RUNS_COUNT_CAP if count_cap is None else count_cap
    scoped = _scoped_runs(access)
    agents = _agents(access)
    narrowed = scoped
    if filters.team:
        narrowed = narrowed.filter(team__slug=filters.team)
    if filters.agent:
        narrowed = narrowed.filter(agent=filters.agent)
    narrowed = _search(narrowed, filters.q)
    if filters.q.strip():
        counts, capped = _sampled_counts(narrowed, SEARCH_COUNT_CAP)
    else:
        counts = _capped_counts(narrowed, count_cap)
        capped = {state for state, n in counts.items() if n > count_cap}
        counts = {state: min(n, count_cap) for state, n in counts.items()}
    listed = narrowed.filter(status=filters.status) if filters.status else narrowed
    listed = listed.select_related("team")

    after = cursor_decode(filters.after) if filters.after else None
    before = cursor_decode(filters.before) if filters.before and not after else None
    if before is not None:
        stamp, run_id = before
        chunk = list(
            listed.filter(Q(created_at__gt=stamp) | Q(created_at=stamp, pk__gt=run_id)).order_by(
                "created_at", "pk"
            )[: size + 1]
        )
        has_newer = len(chunk) > size
        rows = list(reversed(chunk[:size]))
        has_older = True
    else:
        if after is not None:
            stamp, run_id = after
            listed = listed.filter(Q(created_at__lt=stamp) | Q(created_at=stamp, pk__lt=run_id))
        chunk = list(listed.order_by("-created_at", "-pk")[: size + 1])
        has_older = len(chunk) > size
        rows = chunk[:size]
        has_newer = after is not None
    interrupted_unresolved, unresolved_ids = _interrupted_unresolved(
        narrowed, rows, counts, count_cap
    )
    return RunsPage(
        rows=rows,
        counts=counts,
        total=sum(counts.values()),
        has_newer=has_newer and bool(rows),
        has_older=has_older,
        newer_cursor=cursor_encode(rows[0].created_at, rows[0].pk) if rows else "",
        older_cursor=cursor_encode(rows[-1].created_at, rows[-1].pk) if rows else "",
        agents=agents,
        teams=teams,
        needs_resolution=counts.get(RunStatus.STOPPED_DIRTY, 0),
        interrupted_unresolved=min(interrupted_unresolved, count_cap),
        unresolved_ids=unresolved_ids,
        capped=capped,
        interrupted_capped=interrupted_unresolved > count_cap,
    )


def _interrupted_unresolved(
    narrowed: QuerySet[Run], rows: list[Run], counts: dict[str, int], cap: int
) -> tuple[int, set[str]]:
    """How many interrupted runs wait for a resolution (counted up to `cap` + 1), and which of
    the shown rows do — in one query, whatever the page shows. Only asked when there is an
    interrupted run: a page of running runs costs nothing."""
    if not counts.get(RunStatus.INTERRUPTED):
        return 0, set()
    unresolved = _unresolved_interrupted(narrowed).order_by()
    # "" is no run's id: `pk IN ()` cannot be written, and the query stays the same shape.
    shown = [run.pk for run in rows if run.status == RunStatus.INTERRUPTED] or [""]
    count_sql, count_params = unresolved.values("pk")[: cap + 1].query.sql_with_params()
    shown_sql, shown_params = unresolved.filter(pk__in=shown).values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT NULL, (SELECT COUNT(*) FROM ({count_sql}) AS capped)"
            f" UNION ALL SELECT shown.pk, 0 FROM ({shown_sql}) AS shown",
            [*count_params, *shown_params],
        )
        answer = cursor.fetchall()
    how_many = next(n for pk, n in answer if pk is None)
    return how_many, {pk for pk, _n in answer if pk is not None}


# --------------------------------------------------------------------------------------------
# run page


@dataclass
class StepView:
    step: Step
    calls: list[ExecutionRecord]


@dataclass
class RunDetail:
    run: Run
    steps: list[StepView]
    loose_calls: list[ExecutionRecord]
    calls: list[ExecutionRecord]
    outbox: list[OutboxItem]
    artifacts: list[Artifact]
    checkpoints: list[Checkpoint]
    steering: list[SteeringMessage]
    lease: Lease | None
    live_lease: bool
    stop_request: StopRequest | None
    packets: list[dict[str, Any]]
    handoff: Handoff | None
    ledger: list[LedgerEntry]
    ledger_total: int
    unresolved: int
    steps_total: int = 0
    calls_total: int = 0
    outbox_total: int = 0
    artifacts_total: int = 0

    @property
    def windowed(self) -> bool:
        return (
            self.steps_total > len(self.steps)
            or self.calls_total > len(self.calls)
            or self.outbox_total > len(self.outbox)
            or self.artifacts_total > len(self.artifacts)
        )

    @property
    def lease_expired(self) -> bool:
        """A live lease past its expiry: the worker missed its heartbeats (the reaper will act)."""
        return (
            self.live_lease and self.lease is not None and self.lease.expires_at <= timezone.now()
        )

    @property
    def unapplied_steering(self) -> list[SteeringMessage]:
        return [
            message
            for message in self.steering
            if message.status == SteeringStatus.UNAPPLIED_AT_STOP
        ]

    @property
    def latest_packet_epoch(self) -> int | None:
        return self.packets[0]["stop_epoch"] if self.packets else None

    @cached_property
    def stop_history(self) -> StopHistory | None:
        """The latest stop as it happened, if it settled dirty: queried only where it is shown."""
        return stop_history(stop_request=self.stop_request) if self.stop_request else None


def _latest_steps(run: Run, window: int | None) -> tuple[list[Step], int]:
    if window is None:
        steps = list(Step.objects.filter(run=run).order_by("seq"))
        return steps, len(steps)
    # COUNT(*) OVER () is computed before the LIMIT: the total rides along with the window, so a
    # 5,000-step run costs the same number of queries as a 10-step one.
    newest: list[Any] = list(
        Step.objects.filter(run=run).annotate(total=Window(Count("pk"))).order_by("-seq")[:window]
    )
    return newest[::-1], newest[0].total if newest else 0


def _latest_calls(run: Run, window: int | None) -> tuple[list[ExecutionRecord], int]:
    calls = ExecutionRecord.objects.filter(run=run)
    if window is None:
        found = list(calls.order_by("permitted_at", "pk"))
        return found, len(found)
    newest = calls.order_by("-permitted_at", "-pk").values("pk")[:window]
    unresolved = UNCONFIRMED_SIDE_EFFECT
    # The total is of every call, not of the ones loaded: a scalar subquery in the same query.
    every_call = (
        ExecutionRecord.objects.filter(run=run).values("run").annotate(n=Count("pk")).values("n")
    )
    loaded: list[Any] = list(
        calls.filter(Q(pk__in=newest) | unresolved)
        .annotate(total=Subquery(every_call))
        .order_by("permitted_at", "pk")
    )
    return loaded, loaded[0].total if loaded else 0


def _latest_outbox(run: Run, window: int | None) -> tuple[list[OutboxItem], int]:
    # An item the run's epoch froze shows frozen before its row is relabelled (`runs.frozen`).
    items = OutboxItem.objects.filter(run=run)
    if window is None:
        found = frozen.present(run, items.order_by("pk"))
        return found, len(found)
    newest = items.order_by("-pk").values("pk")[:window]
    every_item = (
        OutboxItem.objects.filter(run=run).values("run").annotate(n=Count("pk")).values("n")
    )
    loaded: list[Any] = frozen.present(
        run,
        items.filter(Q(pk__in=newest) | ~Q(status__in=OUTBOX_SETTLED))
        .annotate(total=Subquery(every_item))
        .order_by("pk"),
    )
    return loaded, loaded[0].total if loaded else 0


def _latest_artifacts(run: Run, window: int | None) -> tuple[list[Artifact], int]:
    if window is None:
        found = list(Artifact.objects.filter(run=run).order_by("pk"))
        return found, len(found)
    newest: list[Any] = list(
        Artifact.objects.filter(run=run)
        .annotate(total=Window(Count("pk")))
        .order_by("-pk")[:window]
    )
    return newest[::-1], newest[0].total if newest else 0


def run_detail(run: Run, *, everything: bool = False) -> RunDetail:
    """A bounded number of queries whatever the run's size; children are grouped in Python.

    Without `everything`, only the newest RUN_STEP_WINDOW steps and calls are loaded (plus every
    unresolved call), and the newest RUN_HISTORY_WINDOW sent or discarded outbox items (plus
    every open one) and artifacts: a reviewer needs the recent work and every unknown, not
    5,000 rows."""
    window = None if everything else RUN_STEP_WINDOW
    steps, steps_total = _latest_steps(run, window)
    calls, calls_total = _latest_calls(run, window)
    by_step: dict[int | None, list[ExecutionRecord]] = defaultdict(list)
    for call in calls:
        by_step[call.step_id].append(call)
    steps_by_id = {step.pk: step for step in steps}
    for call in calls:  # avoid a lazy `call.step` query per row in the template
        if call.step_id is not None:
            call.step = steps_by_id.get(call.step_id)
    outbox, outbox_total = _latest_outbox(run, None if everything else RUN_HISTORY_WINDOW)
    artifacts, artifacts_total = _latest_artifacts(run, None if everything else RUN_HISTORY_WINDOW)
    lease = Lease.objects.filter(run=run).order_by("-acquired_at", "-pk").first()
    ledger = list(LedgerEntry.objects.filter(run=run).order_by("-run_seq")[:RUN_LEDGER_LIMIT])
    unresolved = sum(
        1
        for call in calls
        if is_unconfirmed_side_effect(
            side_effect=call.side_effect,
            side_effect_state=call.side_effect_state,
            resolved=call.resolved,
        )
    ) + sum(1 for item in outbox if item.status in OUTBOX_IN_FLIGHT_STATUSES and not item.resolved)
    return RunDetail(
        run=run,
        steps=[StepView(step, by_step.get(step.pk, [])) for step in steps],
        loose_calls=by_step.get(None, []),
        calls=calls,
        outbox=outbox,
        artifacts=artifacts,
        checkpoints=list(Checkpoint.objects.filter(run=run).order_by("pk")),
        steering=list(SteeringMessage.objects.filter(run=run).order_by("pk")),
        lease=lease,
        live_lease=lease is not None and lease.released_at is None,
        stop_request=StopRequest.objects.filter(run=run).order_by("-epoch_after").first(),
        packets=[
            dict(row)
            for row in StopPacket.objects.filter(run=run)
            .order_by("-stop_epoch")
            .values("stop_epoch", "created_at")
        ],
        handoff=Handoff.objects.filter(run=run)
        .select_related("assignee")
        .order_by("-created_at", "-pk")
        .first(),
        ledger=ledger,
        # run_seq counts this run's entries, so the newest one says how many there are.
        ledger_total=ledger[0].run_seq if ledger else 0,
        unresolved=unresolved,
        steps_total=steps_total,
        calls_total=calls_total,
        outbox_total=outbox_total,
        artifacts_total=artifacts_total,
    )


def checkpoint_labels(*, run_id: str) -> list[str]:
    """The run's resume points, oldest first (the choices of a resume or return form)."""
    return list(
        Checkpoint.objects.filter(run_id=run_id).order_by("pk").values_list("label", flat=True)
    )


def outbox_item_get(*, run_id: str, item_id: int) -> OutboxItem | None:
    return OutboxItem.objects.filter(run_id=run_id, pk=item_id).first()


# --------------------------------------------------------------------------------------------
# stop packet page: the immutable snapshot with the current resolution status on top


@dataclass
class Unknown:
    """One thing the packet said nobody knew, and what is known about it now."""

    target: str  # tool_call | outbox | worker
    target_id: str
    snapshot: dict[str, Any]
    current_state: str
    open: bool
    resolution: Resolution | None = None


@dataclass
class FrozenItem:
    public_id: str
    item_id: int
    snapshot: dict[str, Any]
    current_status: str

    @property
    def open(self) -> bool:
        return self.current_status == "frozen"


@dataclass
class PacketView:
    packet: StopPacket | None  # None: an interruption packet, read now and never stored
    snap: dict[str, Any]
    is_current: bool
    unknowns: list[Unknown]
    frozen: list[FrozenItem]
    resolutions: list[Resolution]
    # What the page lists: the snapshot's lists, windowed unless `everything` (see _packet_window).
    completed_steps: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    everything: bool = False

    @property
    def open_unknowns(self) -> int:
        return sum(1 for unknown in self.unknowns if unknown.open)

    @property
    def completed_total(self) -> int:
        return len(self.snap.get("completed_steps", []))

    @property
    def calls_total(self) -> int:
        return len(self.snap.get("tool_calls", []))

    @property
    def artifacts_total(self) -> int:
        return len(self.snap.get("artifacts", []))

    @property
    def unfinished_steps(self) -> list[dict[str, Any]]:
        """Steps that had started and not completed at the stop."""
        return [
            step
            for step in self.snap.get("pending_steps", [])
            if step.get("status") != StepStatus.PLANNED
        ]

    @property
    def unstarted_steps(self) -> list[dict[str, Any]]:
        """Planned steps that never started: nothing of them was left half done."""
        return [
            step
            for step in self.snap.get("pending_steps", [])
            if step.get("status") == StepStatus.PLANNED
        ]

    @property
    def reported_after_stop(self) -> list[dict[str, Any]]:
        """Every fact the worker reported after the stop, from the whole snapshot: the outcomes
        kept instead of applied (a completion that lost the race), then each completed step and
        each tool call the packet tags "after stop"."""
        facts = [
            {"what": f"{report.get('type')} at epoch {report.get('epoch')}", "at": report.get("at")}
            for report in self.snap.get("reported_after_stop", [])
        ]
        facts += [
            {
                "what": f"step {step['seq']} {step.get('name') or step['key']} completed",
                "at": step.get("finished_at"),
            }
            for step in self.snap.get("completed_steps", [])
            if step.get("reported_after_stop")
        ]
        facts += [
            {
                "what": f"tool call {call['tool_call_id']} ({call['tool']}) {call['execution_state']}",
                "at": call.get("last_observed_at"),
            }
            for call in self.snap.get("tool_calls", [])
            if call.get("reported_after_stop")
        ]
        return facts

    @cached_property
    def stop_history(self) -> StopHistory | None:
        """This packet's stop as it happened, if it settled dirty, and what came after it."""
        if self.packet is None:
            return None
        stop_request = StopRequest.objects.filter(
            run_id=self.packet.run_id, epoch_after=self.packet.stop_epoch
        ).first()
        return stop_history(stop_request=stop_request) if stop_request else None

    @property
    def windowed(self) -> bool:
        """Some rows of the snapshot are not on the page (the JSON download has them all)."""
        return (
            self.completed_total > len(self.completed_steps)
            or self.calls_total > len(self.tool_calls)
            or self.artifacts_total > len(self.artifacts)
        )


def _packet_window(
    snap: dict[str, Any], window: int | None
) -> tuple[list[Any], list[Any], list[Any]]:
    """(completed steps, tool calls, artifacts) to list: the newest `window` of each, and every call
    the packet names as an unconfirmed side effect, whatever its age. The snapshot keeps each list
    oldest first (steps by seq, calls by permit time, artifacts by id), so the newest are its tail."""
    completed = snap.get("completed_steps", [])
    calls = snap.get("tool_calls", [])
    artifacts = snap.get("artifacts", [])
    if window is None:
        return completed, calls, artifacts
    unconfirmed = {entry["tool_call_id"] for entry in snap.get("unconfirmed_side_effects", [])}
    cut = max(len(calls) - window, 0)
    shown_calls = [call for call in calls[:cut] if call["tool_call_id"] in unconfirmed] + calls[
        cut:
    ]
    return (
        completed[max(len(completed) - window, 0) :],
        shown_calls,
        artifacts[max(len(artifacts) - window, 0) :],
    )


def packet_view(run: Run, packet: StopPacket, *, everything: bool = False) -> PacketView:
    """The snapshot with what is true now about each unknown; a fixed number of queries.

    Without `everything`, only the newest PACKET_WINDOW completed steps, tool calls and artifacts
    are listed; pending steps, unknowns, frozen and in-flight outbox items are always listed whole:
    they are what a reviewer must act on."""
    return _packet_view(
        run,
        packet.snapshot,
        packet=packet,
        is_current=packet.stop_epoch == run.stop_epoch,
        everything=everything,
    )


def interruption_view(run: Run, *, everything: bool = False) -> PacketView:
    """An interrupted run's packet (`handoff.packets.interruption_packet`) shown as a stop
    packet is: each unknown the interruption left, with what is true now and its resolution."""
    return _packet_view(
        run, interruption_packet(run), packet=None, is_current=True, everything=everything
    )


def _packet_view(
    run: Run,
    snap: dict[str, Any],
    *,
    packet: StopPacket | None,
    is_current: bool,
    everything: bool,
) -> PacketView:
    resolutions = list(Resolution.objects.filter(run=run).order_by("at"))
    resolved = {(resolution.target, resolution.target_id): resolution for resolution in resolutions}
    call_ids = [entry["tool_call_id"] for entry in snap.get("unconfirmed_side_effects", [])]
    calls = {
        call.tool_call_id: call
        for call in ExecutionRecord.objects.filter(run=run, tool_call_id__in=call_ids)
    }
    outbox_ids = [*snap.get("in_flight_outbox_ids", []), *snap.get("frozen_outbox_ids", [])]
    numeric = [
        int(value.split("_", 1)[1]) for value in outbox_ids if value.split("_", 1)[-1].isdigit()
    ]
    items = {
        item.public_id: item
        for item in frozen.present(run, OutboxItem.objects.filter(run=run, pk__in=numeric))
    }
    outbox_snap = {entry["id"]: entry for entry in snap.get("outbox", [])}
    lease_tokens = [
        lease["lease_id"] for lease in snap.get("leases", []) if lease.get("fenced_unconfirmed")
    ]
    fenced_now = set(
        Lease.objects.filter(run=run, token__in=lease_tokens, fenced_unconfirmed=True).values_list(
            "token", flat=True
        )
    )

    unknowns: list[Unknown] = []
    for entry in snap.get("unconfirmed_side_effects", []):
        call = calls.get(entry["tool_call_id"])
        state = call.side_effect_state if call else "missing"
        unknowns.append(
            Unknown(
                "tool_call",
                entry["tool_call_id"],
                entry,
                state,
                open=bool(
                    call
                    and is_unconfirmed_side_effect(
                        side_effect=call.side_effect,
                        side_effect_state=state,
                        resolved=call.resolved,
                    )
                ),
                resolution=resolved.get(("tool_call", entry["tool_call_id"])),
            )
        )
    for public_id in snap.get("in_flight_outbox_ids", []):
        item = items.get(public_id)
        state = item.status if item else "missing"
        unknowns.append(
            Unknown(
                "outbox",
                public_id,
                outbox_snap.get(public_id, {"id": public_id}),
                state,
                open=bool(item and state in OUTBOX_IN_FLIGHT_STATUSES and not item.resolved),
                resolution=resolved.get(("outbox", public_id)),
            )
        )
    for lease in snap.get("leases", []):
        if lease.get("fenced_unconfirmed"):
            token = lease["lease_id"]
            unknowns.append(
                Unknown(
                    "worker",
                    token,
                    lease,
                    "fenced_unconfirmed" if token in fenced_now else "confirmed",
                    open=token in fenced_now,
                    resolution=resolved.get(("worker", token)),
                )
            )
    frozen_items = [
        FrozenItem(
            public_id, items[public_id].pk, outbox_snap.get(public_id, {}), items[public_id].status
        )
        for public_id in snap.get("frozen_outbox_ids", [])
        if public_id in items
    ]
    completed_steps, tool_calls, artifacts = _packet_window(
        snap, None if everything else PACKET_WINDOW
    )
    return PacketView(
        packet=packet,
        snap=snap,
        is_current=is_current,
        unknowns=unknowns,
        frozen=frozen_items,
        resolutions=resolutions,
        completed_steps=completed_steps,
        tool_calls=tool_calls,
        artifacts=artifacts,
        everything=everything,
    )


def stop_packet_get(*, run: Run, epoch: int | None = None) -> StopPacket | None:
    """The run's packet of `epoch`, or its latest packet."""
    packets = StopPacket.objects.filter(run=run)
    if epoch is not None:
        return packets.filter(stop_epoch=epoch).first()
    return packets.order_by("-stop_epoch").first()


def stop_packet_epochs(*, run: Run) -> list[int]:
    """The epochs of the run's packets, newest first."""
    return list(
        StopPacket.objects.filter(run=run)
        .order_by("-stop_epoch")
        .values_list("stop_epoch", flat=True)
    )


@dataclass
class StopHistory:
    """A stop that settled dirty, as it happened, then what came after it: each resolution of
    its unknowns and the moment the run became clean. The StopRequest's `outcome_state` follows
    the run to clean when the last unknown goes, while its `dirty_reasons` stay as they were at
    the settle: the pages read the reasons to say how the stop ended."""

    stop_request: StopRequest
    resolutions: list[Resolution]
    cleaned: LedgerEntry | None  # run.stopped_cleanly after the dirty settle, if it came


def stop_history(*, stop_request: StopRequest) -> StopHistory | None:
    """None unless the stop settled dirty; else three queries (the next stop bounds the window,
    so an older packet's history is its own)."""
    if not stop_request.dirty_reasons or stop_request.stopped_at is None:
        return None
    run_id = stop_request.run_id
    until = (
        StopRequest.objects.filter(run_id=run_id, epoch_after__gt=stop_request.epoch_after)
        .order_by("epoch_after")
        .values_list("requested_at", flat=True)
        .first()
    )
    resolutions = Resolution.objects.filter(run_id=run_id, at__gte=stop_request.stopped_at)
    cleaned = LedgerEntry.objects.filter(
        run_id=run_id, action="run.stopped_cleanly", at__gte=stop_request.stopped_at
    )
    if until is not None:
        resolutions = resolutions.filter(at__lt=until)
        cleaned = cleaned.filter(at__lt=until)
    return StopHistory(
        stop_request=stop_request,
        resolutions=list(resolutions.order_by("at", "pk")),
        cleaned=cleaned.order_by("run_seq").first(),
    )


# --------------------------------------------------------------------------------------------
# handoff inbox


OPEN_HANDOFF = (HandoffStatus.OPEN, HandoffStatus.ACCEPTED)


@dataclass
class HandoffCard:
    handoff: Handoff
    checkpoints: list[Checkpoint]
    unapplied: list[SteeringMessage]
    can_act: bool = False
    # Who may take it: the reviewers and admins of the run's team (the assign control's choices).
    teammates: list[str] = field(default_factory=list)


# The inbox's assignee filter: everyone's, mine, nobody's, or one person's (a username).
ASSIGNEE_ME = "me"
ASSIGNEE_NONE = "none"


def _reviewer_roles() -> list[str]:
    return [role for role in Role.values if Capability.REVIEW in ROLE_CAPABILITIES[role]]


def handoff_teammates(team_ids: list[int] | None) -> dict[int, list[str]]:
    """Per team, the usernames of who may take a handoff (active reviewers and admins), sorted;
    one query."""
    members = Membership.objects.filter(role__in=_reviewer_roles(), user__is_active=True)
    if team_ids is not None:
        members = members.filter(team_id__in=team_ids)
    teammates: dict[int, list[str]] = defaultdict(list)
    for team_id, username in members.order_by("user__username").values_list(
        "team_id", "user__username"
    )[:2000]:
        teammates[team_id].append(username)
    return teammates


def handoff_inbox(
    access: Access, *, user_id: int | None, assignee: str = "", oldest_first: bool = True
) -> tuple[list[HandoffCard], list[Handoff], dict[int, list[str]]]:
    """Open handoffs of the user's teams — all, the user's (`ASSIGNEE_ME`), nobody's
    (`ASSIGNEE_NONE`) or one person's (a username) — by age, oldest first unless asked; the
    recently ended ones; and the teammates per team (for the assign controls and the filter).

    Five queries: open handoffs, their checkpoints, their unapplied steering, the ended ones,
    the teammates.
    """
    handoffs = Handoff.objects.select_related("run", "run__team", "assignee", "stop_packet")
    if not access.all_teams:
        handoffs = handoffs.filter(run__team_id__in=access.team_ids or [])
    open_handoffs = handoffs.filter(status__in=OPEN_HANDOFF)
    if assignee == ASSIGNEE_ME:
        open_handoffs = open_handoffs.filter(assignee_id=user_id)
    elif assignee == ASSIGNEE_NONE:
        open_handoffs = open_handoffs.filter(assignee__isnull=True)
    elif assignee:
        open_handoffs = open_handoffs.filter(assignee__username=assignee)
    order = ("created_at", "pk") if oldest_first else ("-created_at", "-pk")
    open_list = list(open_handoffs.order_by(*order)[:100])
    run_ids = [handoff.run_id for handoff in open_list]
    checkpoints: dict[str, list[Checkpoint]] = defaultdict(list)
    for checkpoint in Checkpoint.objects.filter(run_id__in=run_ids).order_by("pk"):
        checkpoints[checkpoint.run_id].append(checkpoint)
    unapplied: dict[str, list[SteeringMessage]] = defaultdict(list)
    for message in SteeringMessage.objects.filter(
        run_id__in=run_ids, status=SteeringStatus.UNAPPLIED_AT_STOP
    ).order_by("pk"):
        unapplied[message.run_id].append(message)
    teammates = handoff_teammates(access.team_ids)
    cards = [
        HandoffCard(
            handoff,
            checkpoints[handoff.run_id],
            unapplied[handoff.run_id],
            can_act=access.can_act(handoff.run.team_id),
            teammates=teammates.get(handoff.run.team_id, []),
        )
        for handoff in open_list
    ]
    ended = list(handoffs.exclude(status__in=OPEN_HANDOFF).order_by("-closed_at", "-pk")[:20])
    return cards, ended, teammates


def handoff_card(handoff_id: int) -> HandoffCard | None:
    handoff = (
        Handoff.objects.select_related("run", "run__team", "assignee", "stop_packet")
        .filter(pk=handoff_id)
        .first()
    )
    if handoff is None:
        return None
    return HandoffCard(
        handoff,
        list(Checkpoint.objects.filter(run_id=handoff.run_id).order_by("pk")),
        list(
            SteeringMessage.objects.filter(
                run_id=handoff.run_id, status=SteeringStatus.UNAPPLIED_AT_STOP
            ).order_by("pk")
        ),
        teammates=handoff_teammates([handoff.run.team_id]).get(handoff.run.team_id, []),
    )


def user_by_username(*, username: str) -> Any:
    """An active user by username, or None (whether they may take a handoff is the service's
    question)."""
    return get_user_model().objects.filter(username=username, is_active=True).first()


def handoff_get(*, handoff_id: int) -> Handoff | None:
    """One handoff with its run (the run's team decides who may act on it)."""
    return Handoff.objects.select_related("run").filter(pk=handoff_id).first()


def latest_handoff_id(*, run_id: str) -> int | None:
    """The run's newest handoff (a run handed off again after a return has several)."""
    return (
        Handoff.objects.filter(run_id=run_id)
        .order_by("-created_at", "-pk")
        .values_list("pk", flat=True)
        .first()
    )


# --------------------------------------------------------------------------------------------
# API tokens


def api_tokens_of(*, teams: list[Team]) -> list[ApiToken]:
    """The teams' tokens (revoked ones too), by team and name."""
    return list(
        ApiToken.objects.select_related("team")
        .filter(team__in=teams)
        .order_by("team__slug", "name")
    )


def api_token_get(*, token_id: int, teams: list[Team]) -> ApiToken | None:
    """One token, if it belongs to one of `teams`."""
    return ApiToken.objects.filter(pk=token_id, team__in=teams).first()


# --------------------------------------------------------------------------------------------
# audit


@dataclass
class AuditFilters(LedgerFilters):
    """The ledger's filters (`runs.ledger_queries`, shared with the API) and the page cursor."""

    after: int | None = None  # keyset: entries with id < after


def audit_page(
    team_slugs: list[str] | None, filters: AuditFilters, *, size: int = AUDIT_PAGE_SIZE
) -> tuple[list[LedgerEntry], bool]:
    """One page of the filtered ledger, newest first, older than `filters.after`; and whether
    there is more (one query: the page plus one row)."""
    entries = ledger_entries(team_slugs=team_slugs, filters=filters)
    if filters.after:
        entries = entries.filter(pk__lt=filters.after)
    rows = list(entries[: size + 1])
    return rows[:size], len(rows) > size


# --------------------------------------------------------------------------------------------
# stop quality charts


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


# --------------------------------------------------------------------------------------------
# needs me: everything on the user's teams that waits for a person


NEEDS_ME_LIMIT = 100
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


def _unresolved_interrupted(runs: QuerySet[Run]) -> QuerySet[Run]:
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
            needs_interrupted=_count_rows(_unresolved_interrupted(_acting_runs(acting))),
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


def needs_me_items(access: Access, *, now: datetime | None = None) -> list[NeedsMeItem]:
    """What waits for a person on the teams where the user may act, most urgent first; three
    queries (approvals, runs, handoffs), each capped at NEEDS_ME_LIMIT.

    Urgency: 0. approvals whose deadline is within NEEDS_ME_SOON (they expire as a rejection);
    1. dirty stops and interrupted runs with unconfirmed side effects, oldest first (something
    may have happened in the world that nobody has checked); 2. the other approvals, soonest
    deadline first; 3. handoffs waiting to be accepted (and accepted ones that are the user's),
    oldest first."""
    now = now or timezone.now()
    acting = access.ids_with(Role.REVIEWER)
    if acting == []:
        return []
    items: list[NeedsMeItem] = []
    for approval in (
        _waiting_approvals(acting).select_related("run", "team").order_by("deadline", "pk")
    )[:NEEDS_ME_LIMIT]:
        soon = approval.deadline - now <= NEEDS_ME_SOON
        items.append(
            NeedsMeItem(
                "approval", 0 if soon else 2, approval.requested_at, approval.run, approval=approval
            )
        )
    unknown_calls = ExecutionRecord.objects.filter(UNCONFIRMED_SIDE_EFFECT, run=OuterRef("pk"))
    unknown_items = OutboxItem.objects.unconfirmed().filter(run=OuterRef("pk"))
    runs: list[Any] = list(
        _needs_runs(acting)
        .select_related("team")
        .annotate(
            unknown_calls=_count(unknown_calls),
            unknown_items=_count(unknown_items),
            waiting_since=Coalesce("stopped_at", "updated_at"),
        )
        .order_by("waiting_since", "pk")[:NEEDS_ME_LIMIT]
    )
    for run in runs:
        items.append(
            NeedsMeItem(
                "stopped_dirty" if run.status == RunStatus.STOPPED_DIRTY else "interrupted",
                1,
                run.waiting_since,
                run,
                unknowns=(run.unknown_calls or 0) + (run.unknown_items or 0),
            )
        )
    for handoff in (
        _needs_handoffs(acting, access.user_id)
        .select_related("run", "run__team", "assignee")
        .order_by("created_at", "pk")
    )[:NEEDS_ME_LIMIT]:
        items.append(NeedsMeItem("handoff", 3, handoff.created_at, handoff.run, handoff=handoff))
    items.sort(key=lambda item: item.sort_key)
    return items


# --------------------------------------------------------------------------------------------
# /metrics: failed sign-ins (django-axes keeps one row per failure)


def login_failures(*, since: datetime) -> dict[str, int]:
    """Failed console sign-ins since `since`, and how many of them met a lockout."""
    rows = AccessFailureLog.objects.filter(attempt_time__gte=since)
    return {"failed": rows.count(), "locked_out": rows.filter(locked_out=True).count()}


def team_slugs(*, team_ids: list[int]) -> list[str]:
    return list(Team.objects.filter(pk__in=team_ids).values_list("slug", flat=True))
