"""The runs page: filters, counts per state, keyset pagination on (created_at, id)."""

from __future__ import annotations

import base64
import binascii
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.access import Access
from console.converters import RunIdConverter
from console.selectors.needs_me import unresolved_interrupted
from runs.models import (
    Run,
    RunStatus,
    Team,
)

RUNS_PAGE_SIZE = 50


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
    unresolved = unresolved_interrupted(narrowed).order_by()
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
