"""Races with real threads on PostgreSQL: the run row lock leaves no gap (DESIGN §1.1)."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from runs import services
from runs.actors import Actor
from runs.errors import RunNotRunning, StaleEpoch
from runs.models import ExecutionRecord, LedgerEntry, Run, RunStatus, StopReason, StopRequest
from runs.selectors import side_effect_leakage
from tests.support.run_factories import run_complete
from tests.support.scenarios import make_running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ITERATIONS = 200
ALICE = Actor("user", "1", "alice")
AGENT = Actor("api_client", "1", "agent-1")


def _close_connection() -> None:
    connection.close()


def _race(pool: ThreadPoolExecutor, *calls: Callable[[], Any]) -> list[Any]:
    """Start every call at the same instant on its own thread; return results or exceptions."""
    barrier = threading.Barrier(len(calls))

    def start(call: Callable[[], Any]) -> Any:
        barrier.wait()
        if random.random() < 0.5:
            threading.Event().wait(random.random() / 2000)  # jitter so both orders happen
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - collected and asserted below
            return error

    futures = [pool.submit(start, call) for call in calls]
    return [future.result(timeout=30) for future in futures]


@pytest.fixture
def pool():
    executor = ThreadPoolExecutor(max_workers=20)
    yield executor
    # The barrier in _race puts one close on each of the 20 threads: each owns a connection.
    _race(executor, *([_close_connection] * 20))
    executor.shutdown(wait=True)


def test_permit_vs_stop_never_grants_a_permit_after_the_stop(team, pool):
    granted = refused = 0
    violations = []
    for n in range(ITERATIONS):
        run, lease = make_running(team)
        permit, _stop = _race(
            pool,
            lambda run=run, n=n: services.permit_request(
                run_id=run.pk,
                epoch=1,
                tool_call_id=f"call_{n}",
                tool="send_email",
                side_effect="write",
                actor=AGENT,
            ),
            lambda run=run: services.run_stop(
                run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE
            ),
        )
        stop_request = StopRequest.objects.get(run=run)
        record = ExecutionRecord.objects.filter(run=run).first()
        if isinstance(permit, StaleEpoch | RunNotRunning):
            refused += 1
            if record is not None:
                violations.append((n, "refused but a record exists"))
        else:
            granted += 1
            if (
                record is None
                or record.permitted_at >= stop_request.requested_at
                or not record.cancel_requested
            ):
                violations.append((n, "permit not ordered before the stop"))
    leakage = side_effect_leakage(
        since=Run.objects.earliest("created_at").created_at, until=_far_future()
    )
    print(
        f"\npermit vs stop: {ITERATIONS} iterations, {granted} permits before the stop, "
        f"{refused} refused after it, {len(violations)} violations, leakage {leakage['total']}"
    )
    assert violations == []
    assert leakage["total"] == 0
    assert granted + refused == ITERATIONS


def test_twenty_concurrent_stops_make_one_epoch_bump_one_request_one_entry(team, pool):
    violations = []
    for n in range(ITERATIONS):
        run, _lease = make_running(team)
        outcomes = _race(
            pool,
            *[
                (
                    lambda run=run: services.run_stop(
                        run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE, note="stop!"
                    )
                )
                for _ in range(20)
            ],
        )
        errors = [o for o in outcomes if isinstance(o, Exception)]
        run.refresh_from_db()
        created = sum(1 for o in outcomes if not isinstance(o, Exception) and o.created)
        ids = {o.stop_request.pk for o in outcomes if not isinstance(o, Exception)}
        entries = LedgerEntry.objects.filter(run=run, action="run.stop_requested").count()
        if errors or created != 1 or len(ids) != 1 or run.stop_epoch != 2 or entries != 1:
            violations.append((n, errors, created, ids, run.stop_epoch, entries))
        if StopRequest.objects.filter(run=run).count() != 1:
            violations.append((n, "stop requests"))
    print(
        f"\n20 concurrent stops: {ITERATIONS} iterations x 20 threads, {len(violations)} violations"
    )
    assert violations == []


def test_completion_vs_stop_has_exactly_one_winner(team, pool):
    completed_first = stopped_first = 0
    violations = []
    for n in range(ITERATIONS):
        run, _lease = make_running(team)
        complete, stop = _race(
            pool,
            lambda run=run, n=n: run_complete(
                run_id=run.pk, epoch=1, actor=AGENT, result={"rows": n}
            ),
            lambda run=run: services.run_stop(
                run_id=run.pk, reason=StopReason.USER_STOP, actor=ALICE
            ),
        )
        run.refresh_from_db()
        if run.status == RunStatus.COMPLETED:
            completed_first += 1
            ok = (
                not isinstance(stop, Exception)
                and stop.already_finished
                and run.result == {"rows": n}
                and not StopRequest.objects.filter(run=run).exists()
            )
        else:
            stopped_first += 1
            # The completion arrived after the stop: a stale-epoch fact, kept, never applied.
            ok = (
                isinstance(complete, StaleEpoch)
                and run.status == RunStatus.CANCEL_REQUESTED
                and run.result is None
                and run.late_reports
                and run.late_reports[0]["result"] == {"rows": n}
            )
        if not ok:
            violations.append((n, run.status, complete, stop))
    print(
        f"\ncompletion vs stop: {ITERATIONS} iterations, completion won {completed_first}, "
        f"stop won {stopped_first}, {len(violations)} violations"
    )
    assert violations == []


def _far_future():
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(days=1)
