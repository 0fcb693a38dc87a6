"""A bulk stop racing per-run activity, with real threads on PostgreSQL: it never holds one lock
across runs (DESIGN §12). While run A's stop is being written (A's row locked), a permit on run
B — not stopped yet — proceeds; while B's stop is being written, A's worker heartbeats and gets
its signal, so A's stop is committed and its lock released before B's is taken."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection

from runs import services
from runs.actors import Actor
from runs.models import ExecutionRecord, LedgerEntry, RunStatus, StopRequest
from runs.services import BulkFilter, lifecycle
from tests.support.scenarios import make_running, reload

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

AGENT = Actor("api_client", "1", "agent-1")
REVIEWER = Actor("user", "2", "bob")


def _on_own_connection(call: Any) -> Any:
    """Run `call` on a thread with its own connection, which gives up on a lock after 3 s (a
    lock held across runs would show as a lock timeout, not a hung test)."""
    answer: dict[str, Any] = {}

    def work() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '3s'")
            answer["value"] = call()
        except Exception as error:  # noqa: BLE001 - asserted by the caller
            answer["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=20)
    assert not thread.is_alive()
    if "error" in answer:
        raise answer["error"]
    return answer["value"]


def test_a_bulk_stop_never_holds_one_lock_across_runs(team, monkeypatch, settings):
    # One run at a time, so "while A's stop is written" has a B not yet stopped.
    settings.SAFESTOP_BULK_STOP_WORKERS = 1
    run_a, lease_a = make_running(team)
    run_b, lease_b = make_running(team)
    seen: dict[str, Any] = {}
    original = lifecycle.write_stop

    def during_a_stop(run: Any, *args: Any, **kwargs: Any) -> Any:
        # Called inside `stop_locked`, with this run's row locked and its stop uncommitted.
        written = original(run, *args, **kwargs)
        if run.pk == run_a.pk:
            seen["permit_on_b"] = _on_own_connection(
                lambda: services.permit_request(
                    run_id=run_b.pk,
                    epoch=lease_b.epoch,
                    tool_call_id="b-call",
                    tool="search",
                    side_effect="none",
                    actor=AGENT,
                )
            )
        elif run.pk == run_b.pk:
            seen["heartbeat_on_a"] = _on_own_connection(
                lambda: services.lease_heartbeat(
                    run_id=run_a.pk, lease_token=lease_a.token, epoch=lease_a.epoch, actor=AGENT
                )
            )
        return written

    monkeypatch.setattr(lifecycle, "write_stop", during_a_stop)
    answer = services.bulk_stop(
        actor=REVIEWER,
        team_ids=[team.pk],
        filter=BulkFilter(ids=(run_a.pk, run_b.pk)),
        reason="user_stop",
    )

    # B was not locked while A's stop was written: its permit was granted at once.
    record, created = seen["permit_on_b"]
    assert created and record.execution_state == "permitted"
    # A's stop had committed before B's began: A's worker heard the signal and acknowledged.
    assert seen["heartbeat_on_a"].signal["stop_epoch"] == 2
    assert reload(run_a).status == RunStatus.DRAINING
    # B's stop came after the permit and flagged the call it let start.
    assert reload(run_b).status == RunStatus.CANCEL_REQUESTED
    assert ExecutionRecord.objects.get(run=run_b, tool_call_id="b-call").cancel_requested
    assert {result.outcome for result in answer.results} == {"stopped"}
    assert StopRequest.objects.filter(run__in=[run_a, run_b]).count() == 2


def test_runs_stopped_a_few_at_a_time_each_get_their_own_stop(team, settings):
    settings.SAFESTOP_BULK_STOP_WORKERS = 4
    runs = [make_running(team)[0] for _ in range(20)]
    answer = services.bulk_stop(
        actor=REVIEWER, team_ids=[team.pk], filter=BulkFilter(status="running"), reason="user_stop"
    )
    assert answer.bulk.counts == {"stopped": 20}
    saved = {
        result.run_id: (result.outcome, result.stop_request_id)
        for result in answer.bulk.results.all()
    }
    assert set(saved) == {run.pk for run in runs}
    for run in runs:
        stop_request = StopRequest.objects.get(run=run)
        assert saved[run.pk] == ("stopped", stop_request.pk)
        assert reload(run).status == RunStatus.CANCEL_REQUESTED
        assert (
            LedgerEntry.objects.get(run=run, action="run.stop_requested").payload["bulk_id"]
            == answer.bulk.bulk_id
        )
