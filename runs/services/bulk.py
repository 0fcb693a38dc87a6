"""Many runs at once (DESIGN §12): a preview, then one stop per run through `run_stop`.

A bulk stop never holds one lock across runs. Each run is stopped by `run_stop` in its own
durable transaction (its own StopRequest, epoch bump and ledger entry naming the `bulk_id`), so
a permit, a heartbeat or a completion on run B proceeds while run A's stop is being written,
and the stop of run A is committed — and its worker signalled — before run B's lock is taken.
The `BulkStop` record and its per-run results are written in short transactions of their own,
before and between the stops, never around them.
"""

from __future__ import annotations

import queue
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from runs.access import SYSTEM_STOP_REASONS
from runs.actors import Actor
from runs.errors import BulkTooLarge, DomainError, InvalidInput, NotFound, PreviewExpired
from runs.models import (
    STOPPABLE_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    BulkStop,
    BulkStopOutcome,
    BulkStopPreview,
    BulkStopResult,
    ExecutionRecord,
    Run,
    RunStatus,
    StopReason,
    Team,
)
from runs.services.lifecycle import run_stop

# Past this many runs to stop, a bulk stop needs `confirm_large` (a typo in a filter should not
# stop a whole fleet). Tests lower it with the setting.
DEFAULT_BULK_STOP_LIMIT = 10_000
# Reasons a bulk stop may carry: a caller's own (not the system's), and not a takeover, which
# hands each run to a person — one inbox entry per run is not something to do by the thousand.
BULK_STOP_REASONS = [
    reason
    for reason in StopReason.values
    if reason not in SYSTEM_STOP_REASONS and reason != StopReason.MANUAL_TAKEOVER
]
MAX_BULK_IDS = 10_000
# Runs stopped at the same time (SAFESTOP_BULK_STOP_WORKERS), each on its own connection: a
# stop is a dozen short queries, so one connection alone spends most of its time waiting on
# round trips (docs/BENCHMARKS.md).
DEFAULT_BULK_STOP_WORKERS = 16
# A worker writes its results back every this many runs (the result page fills in as it goes).
_RESULT_BATCH = 50
RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,32}$"  # the API schema documents it
_RUN_ID = re.compile(RUN_ID_PATTERN)


# A confirm must follow its preview within this many seconds (SAFESTOP_BULK_PREVIEW_SECONDS):
# after that the reviewer previews again rather than act on a picture of the fleet gone stale.
DEFAULT_BULK_PREVIEW_SECONDS = 600
# A preview remembers at most this many runs; a wider filter is refused at the preview (narrow it,
# or stop in parts): a preview that could not say which runs it shows cannot be confirmed.
MAX_PREVIEW_RUNS = 100_000


def bulk_preview_seconds() -> int:
    return int(getattr(settings, "SAFESTOP_BULK_PREVIEW_SECONDS", DEFAULT_BULK_PREVIEW_SECONDS))


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


@dataclass
class BulkStopAnswer:
    bulk: BulkStop
    created: bool
    results: list[BulkStopResult]


def _validate(filter: BulkFilter, *, team_ids: list[int] | None) -> None:
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


def _matching(filter: BulkFilter, *, team_ids: list[int] | None) -> QuerySet[Run]:
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


def _outcome_of_status(status: str) -> str:
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
    run_ids = _stoppable_ids(filter, team_ids=team_ids, refusals=refusals or {})
    record = BulkStopPreview.objects.create(
        actor_kind=actor.kind, actor_id=actor.id, filter=filter.as_dict(), run_ids=run_ids
    )
    preview.preview_id = record.preview_id
    preview.run_ids = run_ids
    # The ids are the truth the confirm acts on; counts read a moment earlier may differ by a run
    # that changed state in between, so the number the reviewer is asked about is the ids'.
    preview.will_stop = len(run_ids)
    return preview


def _stoppable_ids(
    filter: BulkFilter, *, team_ids: list[int] | None, refusals: Mapping[int, str]
) -> list[str]:
    runs = _matching(filter, team_ids=team_ids).filter(status__in=STOPPABLE_STATUSES)
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
    _validate(filter, team_ids=team_ids)
    refusals = refusals or {}
    rows = list(
        _matching(filter, team_ids=team_ids).values("team_id", "status").annotate(n=Count("pk"))
    )
    by_status: dict[str, int] = {}
    tally = dict.fromkeys(BulkStopOutcome.values, 0)
    refused: set[str] = set()
    for row in rows:
        status, n = row["status"], row["n"]
        by_status[status] = by_status.get(status, 0) + n
        outcome = _outcome_of_status(status)
        if outcome == BulkStopOutcome.PENDING and row["team_id"] in refusals:
            outcome = BulkStopOutcome.NOT_ALLOWED
            refused.add(refusals[row["team_id"]])
        tally[outcome] += n
    not_found: list[str] = []
    if filter.ids:
        found = set(
            _matching(BulkFilter(ids=filter.ids), team_ids=team_ids).values_list("pk", flat=True)
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


def _existing(actor: Actor, idempotency_key: str) -> BulkStopAnswer | None:
    if not idempotency_key:
        return None
    bulk = BulkStop.objects.filter(
        actor_kind=actor.kind, actor_id=actor.id, idempotency_key=idempotency_key
    ).first()
    if bulk is None:
        return None
    return BulkStopAnswer(bulk, False, list(bulk.results.order_by("id")))


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


def bulk_stop(
    *,
    actor: Actor,
    team_ids: list[int] | None,
    filter: BulkFilter,
    reason: str,
    note: str = "",
    idempotency_key: str = "",
    confirm_large: bool = False,
    refusals: Mapping[int, str] | None = None,
    preview_id: str = "",
) -> BulkStopAnswer:
    """Stop the runs a preview showed (or, without `preview_id`, every run the filter selects
    now), one `run_stop` each; one result per run.

    1. A retry (same caller, same `idempotency_key`) answers the first bulk stop and its results.
    2. With `preview_id`: the caller's preview (`bulk_preview_get`) gives the filter and the very
       runs to stop; runs that began to match the filter since are counted in
       `new_since_preview` and left alone. Without: the runs (of `team_ids`; None: every team)
       the filter selects that are not finished, and every run named in `ids` whatever its
       state. More than SAFESTOP_BULK_STOP_LIMIT runs to stop is refused unless `confirm_large`.
    3. Write the BulkStop and a result per run in one short transaction: runs already
       stopping, stopped or finished, runs of a team in `refusals` and unknown ids get their
       answer at once; the rest are `pending`.
    4. Stop each pending run through `run_stop` (its own transaction and lock, `bulk_id` in its
       ledger entry) and record what it answered, in batches.
    """
    if reason not in BULK_STOP_REASONS:
        raise InvalidInput(f"reason must be one of {', '.join(BULK_STOP_REASONS)}", field="reason")
    earlier = _existing(actor, idempotency_key)
    if earlier is not None:
        return earlier
    refusals = refusals or {}
    new_since_preview = 0
    if preview_id:
        preview = bulk_preview_get(actor=actor, preview_id=preview_id)
        filter = bulk_filter_from_dict(preview.filter)
        _validate(filter, team_ids=team_ids)
        shown = set(preview.run_ids)
        # Only the previewed runs, and only those the caller may still see.
        selected = list(
            _matching(BulkFilter(ids=tuple(preview.run_ids)), team_ids=team_ids)
            .order_by("created_at", "pk")
            .values_list("pk", "team_id", "status", "stop_epoch")
        )
        new_since_preview = sum(
            1
            for run_id in _stoppable_ids(filter, team_ids=team_ids, refusals=refusals)
            if run_id not in shown
        )
        named = shown
    else:
        _validate(filter, team_ids=team_ids)
        named = set(filter.ids)
        selected = list(
            _matching(filter, team_ids=team_ids)
            .filter(~Q(status__in=TERMINAL_STATUSES) | Q(pk__in=named))
            .order_by("created_at", "pk")
            .values_list("pk", "team_id", "status", "stop_epoch")
        )
    results: list[BulkStopResult] = []
    for run_id, team_id, status, epoch in selected:
        outcome = _outcome_of_status(status)
        detail = ""
        if outcome == BulkStopOutcome.PENDING and team_id in refusals:
            outcome, detail = BulkStopOutcome.NOT_ALLOWED, refusals[team_id][:300]
        results.append(
            BulkStopResult(
                run_id=run_id, outcome=outcome, status=status, stop_epoch=epoch, detail=detail
            )
        )
    found = {run_id for run_id, *_ in selected}
    results.extend(
        BulkStopResult(
            run_id=run_id, outcome=BulkStopOutcome.NOT_FOUND, detail="no such run among yours"
        )
        for run_id in dict.fromkeys(filter.ids if not preview_id else ())
        if run_id not in found
    )
    to_stop = [result for result in results if result.outcome == BulkStopOutcome.PENDING]
    limit = bulk_stop_limit()
    if len(to_stop) > limit and not confirm_large:
        raise BulkTooLarge(
            f"this would stop {len(to_stop):,} runs, more than {limit:,} at once; "
            "confirm to stop them all",
            would_stop=len(to_stop),
            limit=limit,
        )
    try:
        with transaction.atomic(durable=True):
            bulk = BulkStop.objects.create(
                requested_by=actor.name,
                actor_kind=actor.kind,
                actor_id=actor.id,
                reason=reason,
                note=note,
                filter=filter.as_dict(),
                idempotency_key=idempotency_key,
                requested=len(results),
                preview_id=preview_id,
                new_since_preview=new_since_preview,
            )
            for result in results:
                result.bulk = bulk
            BulkStopResult.objects.bulk_create(results, batch_size=1000)
    except IntegrityError:
        # The same key, sent twice at once: the other request's bulk stop is the answer.
        earlier = _existing(actor, idempotency_key)
        if earlier is None:
            raise
        return earlier
    _stop_each(bulk, to_stop, actor=actor, reason=reason, note=note)
    bulk.counts = _count(results)
    bulk.finished_at = timezone.now()
    bulk.save(update_fields=["counts", "finished_at"])
    return BulkStopAnswer(bulk, True, results)


def _workers() -> int:
    """How many runs are stopped at the same time, each on its own connection and in its own
    transaction. One when the caller is inside a transaction (other connections would not see
    what it has not committed: the tests) or on SQLite (one writer at a time anyway)."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return 1
    return bulk_stop_workers()


def bulk_stop_workers() -> int:
    return max(1, int(getattr(settings, "SAFESTOP_BULK_STOP_WORKERS", DEFAULT_BULK_STOP_WORKERS)))


def _stop_one(
    result: BulkStopResult, *, bulk_id: str, actor: Actor, reason: str, note: str
) -> BulkStopResult:
    try:
        outcome = run_stop(
            run_id=result.run_id, reason=reason, actor=actor, note=note, bulk_id=bulk_id
        )
    except DomainError as error:
        result.outcome = BulkStopOutcome.FAILED
        result.detail = error.detail[:300]
        result.status = error.status or result.status
        result.stop_epoch = error.stop_epoch or result.stop_epoch
        return result
    result.status = outcome.status
    result.stop_epoch = outcome.stop_epoch
    result.stop_request = outcome.stop_request
    if outcome.already_finished:
        result.outcome = BulkStopOutcome.ALREADY_FINISHED
    elif outcome.created:
        result.outcome = BulkStopOutcome.STOPPED
    else:
        # A stop that got there first (between the selection and this run's lock).
        result.outcome = _outcome_of_status(outcome.status)
    return result


def _stop_each(
    bulk: BulkStop, pending: Sequence[BulkStopResult], *, actor: Actor, reason: str, note: str
) -> None:
    """Each run through `run_stop`, a few at a time (`_workers`), its result saved as soon as its
    stop committed (so the result page fills in as the bulk stop goes).

    Workers share nothing but a queue of runs: each holds at most one run's lock, for the length
    of that run's own transaction, so no two runs' stops ever wait on each other.
    """
    stop = partial(_stop_one, bulk_id=bulk.bulk_id, actor=actor, reason=reason, note=note)
    workers = min(_workers(), len(pending))
    if workers <= 1:
        for result in pending:
            _save_result(stop(result))
        return
    todo: queue.SimpleQueue[BulkStopResult] = queue.SimpleQueue()
    for result in pending:
        todo.put(result)
    failures: list[BaseException] = []

    def work() -> None:
        done: list[BulkStopResult] = []
        try:
            while not failures:
                try:
                    result = todo.get_nowait()
                except queue.Empty:
                    break
                done.append(stop(result))
                if len(done) >= _RESULT_BATCH:
                    _save_results_postgresql(done)
                    done = []
        except BaseException as error:  # re-raised in the caller's thread below
            failures.append(error)
        finally:
            try:
                _save_results_postgresql(done)
            finally:
                connection.close()  # this thread's connection, back to the pool

    threads = [
        threading.Thread(target=work, name=f"bulk-stop-{n}", daemon=True) for n in range(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def _save_results_postgresql(results: list[BulkStopResult]) -> None:
    """A worker's last few results in one UPDATE … FROM (VALUES …): the Python of one ORM
    update per run (~0.4 ms) was a tenth of a bulk stop's CPU, and bulk_update's CASE per row
    (~2 ms a row) more than that (docs/BENCHMARKS.md)."""
    if not results:
        return
    rows = ", ".join(["(%s::bigint, %s, %s, %s::integer, %s::bigint, %s)"] * len(results))
    params: list[Any] = []
    for result in results:
        params += [
            result.pk,
            result.outcome,
            result.status,
            result.stop_epoch,
            result.stop_request.pk if result.stop_request is not None else None,
            result.detail,
        ]
    table = connection.ops.quote_name(BulkStopResult._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS r SET outcome = v.outcome, status = v.status, "
            "stop_epoch = v.stop_epoch, stop_request_id = v.stop_request_id, detail = v.detail "
            f"FROM (VALUES {rows}) AS v(id, outcome, status, stop_epoch, stop_request_id, detail) "
            "WHERE r.id = v.id",
            params,
        )


def _save_result(result: BulkStopResult) -> None:
    BulkStopResult.objects.filter(pk=result.pk).update(
        outcome=result.outcome,
        status=result.status,
        stop_epoch=result.stop_epoch,
        stop_request=result.stop_request,
        detail=result.detail,
    )


def _count(results: Sequence[BulkStopResult]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for result in results:
        counts[result.outcome] = counts.get(result.outcome, 0) + 1
    return counts


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
