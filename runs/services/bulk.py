"""Many runs at once (DESIGN §12): one stop per run through `run_stop`, after a preview
(`bulk_preview.py`).

A bulk stop never holds one lock across runs. Each run is stopped by `run_stop` in its own
durable transaction (its own StopRequest, epoch bump and ledger entry naming the `bulk_id`), so
a permit, a heartbeat or a completion on run B proceeds while run A's stop is being written,
and the stop of run A is committed — and its worker signalled — before run B's lock is taken.
The `BulkStop` record and its per-run results are written in short transactions of their own,
before and between the stops, never around them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q
from django.utils import timezone

from runs import sql
from runs.access import SYSTEM_STOP_REASONS
from runs.actors import Actor
from runs.errors import BulkTooLarge, DomainError, InvalidInput
from runs.models import (
    TERMINAL_STATUSES,
    BulkStop,
    BulkStopOutcome,
    BulkStopResult,
    StopReason,
)
from runs.selectors import bulk_preview_get
from runs.services.bulk_preview import (
    BulkFilter,
    bulk_filter_from_dict,
    bulk_filter_validate,
    bulk_matching_runs,
    bulk_outcome_of_status,
    bulk_stop_limit,
    bulk_stoppable_ids,
)
from runs.services.lifecycle import run_stop

# Reasons a bulk stop may carry: a caller's own (not the system's), and not a takeover, which
# hands each run to a person — one inbox entry per run is not something to do by the thousand.
BULK_STOP_REASONS = [
    reason
    for reason in StopReason.values
    if reason not in SYSTEM_STOP_REASONS and reason != StopReason.MANUAL_TAKEOVER
]
# Runs stopped at the same time (SAFESTOP_BULK_STOP_WORKERS), each on its own connection: a
# stop is a dozen short queries, so one connection alone spends most of its time waiting on
# round trips (docs/BENCHMARKS.md).
DEFAULT_BULK_STOP_WORKERS = 16
# A worker writes its results back every this many runs (the result page fills in as it goes).
_RESULT_BATCH = 50


@dataclass
class BulkStopAnswer:
    bulk: BulkStop
    created: bool
    results: list[BulkStopResult]


def _existing(actor: Actor, idempotency_key: str) -> BulkStopAnswer | None:
    if not idempotency_key:
        return None
    bulk = BulkStop.objects.filter(
        actor_kind=actor.kind, actor_id=actor.id, idempotency_key=idempotency_key
    ).first()
    if bulk is None:
        return None
    return BulkStopAnswer(bulk, False, list(bulk.results.order_by("id")))


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
        bulk_filter_validate(filter, team_ids=team_ids)
        shown = set(preview.run_ids)
        # Only the previewed runs, and only those the caller may still see.
        selected = list(
            bulk_matching_runs(BulkFilter(ids=tuple(preview.run_ids)), team_ids=team_ids)
            .order_by("created_at", "pk")
            .values_list("pk", "team_id", "status", "stop_epoch")
        )
        new_since_preview = sum(
            1
            for run_id in bulk_stoppable_ids(filter, team_ids=team_ids, refusals=refusals)
            if run_id not in shown
        )
        named = shown
    else:
        bulk_filter_validate(filter, team_ids=team_ids)
        named = set(filter.ids)
        selected = list(
            bulk_matching_runs(filter, team_ids=team_ids)
            .filter(~Q(status__in=TERMINAL_STATUSES) | Q(pk__in=named))
            .order_by("created_at", "pk")
            .values_list("pk", "team_id", "status", "stop_epoch")
        )
    results: list[BulkStopResult] = []
    for run_id, team_id, status, epoch in selected:
        outcome = bulk_outcome_of_status(status)
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
    if not sql.prepared_statements() or connection.in_atomic_block:
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
        result.outcome = bulk_outcome_of_status(outcome.status)
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
