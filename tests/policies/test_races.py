"""Races with real threads on PostgreSQL (DESIGN §14): a policy's stop takes the same run lock
as a reviewer's stop, a completion and an approval decision, so exactly one wins and the
loser sees the winner's state. Both orders are observed."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from policies.models import PolicyHit
from runs import services
from runs.actors import Actor
from runs.errors import RunNotRunning, StaleEpoch
from runs.models import Approval, ApprovalStatus, LedgerEntry, RunStatus, StopRequest
from tests.support.policies import permit, policy
from tests.support.run_factories import run_complete
from tests.support.scenarios import make_running, reload

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ITERATIONS = 40
ALICE = Actor("user", "1", "alice")
AGENT = Actor("api_client", "1", "agent-1")
REFUSED = (RunNotRunning, StaleEpoch)


def _close_connection() -> None:
    connection.close()


def _race(pool: ThreadPoolExecutor, *calls: Callable[[], Any]) -> list[Any]:
    barrier = threading.Barrier(len(calls))

    def start(call: Callable[[], Any]) -> Any:
        barrier.wait()
        if random.random() < 0.5:
            threading.Event().wait(random.random() / 1000)  # jitter so both orders happen
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - collected and asserted below
            return error

    return [future.result(timeout=30) for future in [pool.submit(start, c) for c in calls]]


@pytest.fixture
def pool():
    executor = ThreadPoolExecutor(max_workers=2)
    yield executor
    # One close on each thread: each owns a connection (looked up on that thread).
    _race(executor, _close_connection, _close_connection)
    executor.shutdown(wait=True)


def _looping_run(team):
    run, _lease = make_running(team)
    permit(run, "c0")  # the next identical call is the loop
    return run


def _one_stop(run) -> StopRequest:
    [stop] = StopRequest.objects.filter(run=run)
    entries = LedgerEntry.objects.filter(run=run, action="run.stop_requested")
    assert [entry.payload["stop_request_id"] for entry in entries] == [stop.pk]
    return stop


def test_a_policy_stop_racing_a_reviewers_stop(team, pool):
    policy(team, "loop", "call.repeats >= 2")
    winners = {"policy": 0, "reviewer": 0}
    for _ in range(ITERATIONS):
        run = _looping_run(team)
        asked, _stop = _race(
            pool,
            lambda run=run: permit(run, "c1"),
            lambda run=run: services.run_stop(run_id=run.pk, reason="user_stop", actor=ALICE),
        )
        assert isinstance(asked, REFUSED)  # either way the looping call never gets a permit
        stop = _one_stop(run)
        hits = PolicyHit.objects.filter(run=run, action="stop")
        if stop.requested_by == "policy:loop":
            winners["policy"] += 1
            assert [hit.stop_request_id for hit in hits] == [stop.pk]
        else:
            winners["reviewer"] += 1
            assert stop.requested_by == "alice" and not hits.exists()
    assert all(winners.values()), winners


def test_a_policy_stop_racing_a_completion(team, pool):
    policy(team, "loop", "call.repeats >= 2")
    winners = {"policy": 0, "completion": 0}
    for n in range(ITERATIONS):
        run = _looping_run(team)
        _race(
            pool,
            lambda run=run: permit(run, "c1"),
            lambda run=run, n=n: run_complete(run_id=run.pk, epoch=1, actor=AGENT, result={"n": n}),
        )
        run = reload(run)
        if run.status == RunStatus.COMPLETED:
            winners["completion"] += 1
            assert not StopRequest.objects.filter(run=run).exists()
            assert not PolicyHit.objects.filter(run=run).exists()
        else:
            winners["policy"] += 1
            assert _one_stop(run).requested_by == "policy:loop"
            assert run.late_reports and run.late_reports[0]["result"] == {"n": n}
    assert all(winners.values()), winners


def test_a_policy_stop_racing_an_approval_decision(team, pool):
    policy(team, "loop", "call.repeats >= 2")
    policy(
        team,
        "hold-writes",
        'call.side_effect == "write"',
        action="require_approval",
    )
    winners = {"policy": 0, "decision": 0}
    for _ in range(ITERATIONS):
        run, _lease = make_running(team)
        held, _ = permit(run, "w1", side_effect="write", arguments={"x": 1})
        permit(run, "c0")  # the next identical call is the loop
        approval = Approval.objects.get(execution_record=held)
        asked, decided = _race(
            pool,
            lambda run=run: permit(run, "c1"),
            lambda approval=approval: services.approval_decide(
                approval_id=approval.pk, decision="approve", actor=ALICE
            ),
        )
        assert isinstance(asked, REFUSED)
        assert _one_stop(run).requested_by == "policy:loop"
        approval.refresh_from_db()
        if approval.status == ApprovalStatus.VOID:
            winners["policy"] += 1  # the stop voided the waiting approval; the decision lost
            assert isinstance(decided, Exception)
        else:
            winners["decision"] += 1  # approved first; the stop then found it in flight
            assert approval.status == ApprovalStatus.APPROVED
            held.refresh_from_db()
            assert held.cancel_requested
    assert all(winners.values()), winners
