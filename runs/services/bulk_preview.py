"""The bulk stop's preview (DESIGN §12): which runs a filter selects, by state, what a stop of
them would do, and the record of what one reviewer was shown (`bulk_stop_preview` with an
actor), which a confirm naming it acts on and no other runs. The stop itself is `bulk.py`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from runs.actors import Actor
from runs.errors import InvalidInput
from runs.models import (
    STOPPABLE_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    BulkStopOutcome,
    BulkStopPreview,
    ExecutionRecord,
    Run,
    RunStatus,
    Team,
)

# Past this many runs to stop, a bulk stop needs `confirm_large` (a typo in a filter should not
# stop a whole fleet). Tests lower it with the setting.
DEFAULT_BULK_STOP_LIMIT = 10_000
MAX_BULK_IDS = 10_000
RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,32}$"  # the API schema documents it
_RUN_ID = re.compile(RUN_ID_PATTERN)


# A preview remembers at most this many runs; a wider filter is refused at the preview (narrow it,
# or stop in parts): a preview that could not say which runs it shows cannot be confirmed.
MAX_PREVIEW_RUNS = 100_000


def bulk_stop_limit() -> int:
    return int(getattr(settings, "SAFESTOP_BULK_STOP_LIMIT", DEFAULT_BULK_STOP_LIMIT))


@dataclass(frozen=True)
class BulkFilter:
    """Which runs: every given field must match (blank fields match anything).

    `search` is the console's search box (a run id prefix, or part of the title or id);
    `every_run` is the kill switch — every run of the caller's teams — and must be said out
    loud: an empty filter is refused rather than read as "everything".
    """

    agent: str = ""
    team: str = ""  # slug
    status: str = ""
    tool: str = ""
    ids: tuple[str, ...] = ()
    search: str = ""
    every_run: bool = False

    @property
    def is_empty(self) -> bool:
        return not (
            self.agent or self.team or self.status or self.tool or self.ids or self.search.strip()
        )

    def as_dict(self) -> dict[str, Any]:
        named: dict[str, Any] = {
            key: value
            for key, value in (
                ("agent", self.agent),
                ("team", self.team),
                ("status", self.status),
                ("tool", self.tool),
                ("search", self.search.strip()),
            )
            if value
        }
        if self.ids:
            named["ids"] = list(self.ids)
        if self.every_run and self.is_empty:
            named["all"] = True
        return named


@dataclass
class BulkPreview:
    """What a bulk stop with this filter would do now (it may differ a moment later).

    With a `preview_id` (the preview was recorded for its caller), `run_ids` are the runs a
    confirm naming it will stop, and no others."""

    matching: int
    by_status: dict[str, int]
    will_stop: int
    already_stopping: int
    already_stopped: int
    already_finished: int
    not_allowed: int
    not_found: list[str]
    limit: int
    refusals: list[str] = field(default_factory=list)
    preview_id: str = ""
    run_ids: list[str] = field(default_factory=list)

    @property
    def needs_confirm(self) -> bool:
        return self.will_stop > self.limit


def bulk_filter_validate(filter: BulkFilter, *, team_ids: list[int] | None) -> None:
    if filter.is_empty and not filter.every_run:
        raise InvalidInput(
            "name at least one of agent, team, status, tool or ids "
            '(to stop every run of your teams, say "all": true)',
            field="filter",
        )
    if filter.status and filter.status not in RunStatus.values:
        raise InvalidInput(f"status must be one of {', '.join(RunStatus.values)}", field="status")
    if len(filter.ids) > MAX_BULK_IDS:
        raise InvalidInput(f"at most {MAX_BULK_IDS} ids at once", field="ids")
    bad = next((run_id for run_id in filter.ids if not _RUN_ID.fullmatch(run_id)), None)
    if bad is not None:
        raise InvalidInput(f"{bad[:40]!r} is not a run id", field="ids")
    if filter.team:
        teams = Team.objects.filter(slug=filter.team)
        if team_ids is not None:
            teams = teams.filter(pk__in=team_ids)
        if not teams.exists():
            # The same answer for a team that does not exist and one the caller is not in.
            raise InvalidInput(f"no team {filter.team[:64]!r} among yours", field="team")


def bulk_matching_runs(filter: BulkFilter, *, team_ids: list[int] | None) -> QuerySet[Run]:
    runs = Run.objects.all() if team_ids is None else Run.objects.filter(team_id__in=team_ids)
    if filter.team:
        runs = runs.filter(team__slug=filter.team)
    if filter.agent:
        runs = runs.filter(agent=filter.agent)
    if filter.status:
        runs = runs.filter(status=filter.status)
    if filter.tool:
        runs = runs.filter(
            Exists(ExecutionRecord.objects.filter(run_id=OuterRef("pk"), tool=filter.tool))
        )
    if filter.ids:
        runs = runs.filter(pk__in=filter.ids)
    search = filter.search.strip()
    if search:
        # The runs page's search box (console.selectors), so "Stop all matching" stops what the
        # table lists.
        if search.startswith("run_"):
            runs = runs.filter(pk__istartswith=search)
        else:
            runs = runs.filter(Q(title__icontains=search) | Q(pk__icontains=search))
    return runs.order_by()


def bulk_outcome_of_status(status: str) -> str:
    if status in STOPPABLE_STATUSES:
        return BulkStopOutcome.PENDING
    if status in STOPPING_STATUSES:
        return BulkStopOutcome.ALREADY_STOPPING
    if status in TERMINAL_STATUSES:
        return BulkStopOutcome.ALREADY_FINISHED
    return BulkStopOutcome.ALREADY_STOPPED  # stopped cleanly or dirty, handed off


def bulk_stop_preview(
    *,
    team_ids: list[int] | None,
    filter: BulkFilter,
    refusals: Mapping[int, str] | None = None,
    actor: Actor | None = None,
) -> BulkPreview:
    """How many runs the filter selects, by state, and how many a bulk stop would stop.

    `team_ids`: the teams whose runs the caller may see (None: every team); runs of other teams
    are never counted, and an id of theirs is "not found" like one that does not exist.
    `refusals`: team id → why the caller may not stop that team's runs for this reason.
    Two queries (three with ids), whatever the number of runs. With an `actor`, the preview is
    recorded (one more query, and one INSERT): its `preview_id` and the ids of the runs it would
    stop, which a confirm naming it stops and no others.
    """
    preview = _preview_counts(team_ids=team_ids, filter=filter, refusals=refusals)
    if actor is None:
        return preview
    run_ids = bulk_stoppable_ids(filter, team_ids=team_ids, refusals=refusals or {})
    record = BulkStopPreview.objects.create(
        actor_kind=actor.kind, actor_id=actor.id, filter=filter.as_dict(), run_ids=run_ids
    )
    preview.preview_id = record.preview_id
    preview.run_ids = run_ids
    # The ids are the truth the confirm acts on; counts read a moment earlier may differ by a run
    # that changed state in between, so the number the reviewer is asked about is the ids'.
    preview.will_stop = len(run_ids)
    return preview


def bulk_stoppable_ids(
    filter: BulkFilter, *, team_ids: list[int] | None, refusals: Mapping[int, str]
) -> list[str]:
    runs = bulk_matching_runs(filter, team_ids=team_ids).filter(status__in=STOPPABLE_STATUSES)
    if refusals:
        runs = runs.exclude(team_id__in=list(refusals))
    ids = list(
        runs.order_by("created_at", "pk").values_list("pk", flat=True)[: MAX_PREVIEW_RUNS + 1]
    )
    if len(ids) > MAX_PREVIEW_RUNS:
        raise InvalidInput(
            f"this filter selects more than {MAX_PREVIEW_RUNS:,} runs to stop; narrow it, "
            "or stop them in parts",
            field="filter",
        )
    return ids


def _preview_counts(
    *,
    team_ids: list[int] | None,
    filter: BulkFilter,
    refusals: Mapping[int, str] | None,
) -> BulkPreview:
    bulk_filter_validate(filter, team_ids=team_ids)
    refusals = refusals or {}
    rows = list(
        bulk_matching_runs(filter, team_ids=team_ids)
        .values("team_id", "status")
        .annotate(n=Count("pk"))
    )
    by_status: dict[str, int] = {}
    tally = dict.fromkeys(BulkStopOutcome.values, 0)
    refused: set[str] = set()
    for row in rows:
        status, n = row["status"], row["n"]
        by_status[status] = by_status.get(status, 0) + n
        outcome = bulk_outcome_of_status(status)
        if outcome == BulkStopOutcome.PENDING and row["team_id"] in refusals:
            outcome = BulkStopOutcome.NOT_ALLOWED
            refused.add(refusals[row["team_id"]])
        tally[outcome] += n
    not_found: list[str] = []
    if filter.ids:
        found = set(
            bulk_matching_runs(BulkFilter(ids=filter.ids), team_ids=team_ids).values_list(
                "pk", flat=True
            )
        )
        not_found = [run_id for run_id in dict.fromkeys(filter.ids) if run_id not in found]
    return BulkPreview(
        matching=sum(by_status.values()),
        by_status=by_status,
        will_stop=tally[BulkStopOutcome.PENDING],
        already_stopping=tally[BulkStopOutcome.ALREADY_STOPPING],
        already_stopped=tally[BulkStopOutcome.ALREADY_STOPPED],
        already_finished=tally[BulkStopOutcome.ALREADY_FINISHED],
        not_allowed=tally[BulkStopOutcome.NOT_ALLOWED],
        not_found=not_found,
        limit=bulk_stop_limit(),
        refusals=sorted(refused),
    )


def bulk_filter_from_dict(named: Mapping[str, Any]) -> BulkFilter:
    """The filter a preview recorded (`BulkFilter.as_dict`), back as a filter."""
    return BulkFilter(
        agent=str(named.get("agent", "")),
        team=str(named.get("team", "")),
        status=str(named.get("status", "")),
        tool=str(named.get("tool", "")),
        ids=tuple(named.get("ids", ())),
        search=str(named.get("search", "")),
        every_run=bool(named.get("all", False))
        or not any(named.get(key) for key in ("agent", "team", "status", "tool", "ids", "search")),
    )
