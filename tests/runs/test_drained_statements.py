"""The worker's drained answer stays lean and its stop packet stays what it was.

`run_drained` settles the run and builds the stop packet under the run lock: every statement
it sends, and every round trip it waits for, is time between the worker's answer and
`stopped_cleanly`. Its reads and writes are built or compiled once per process
(`runs.sql.OnceCompiled`, `runs.sql.save_fields`) and its independent reads share a round trip
(`runs.sql.pipelined`); the packet they build must be the one the ORM builds, byte for byte, and
the ORM path (SQLite) must settle the same way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from handoff.models import StopPacket
from handoff.packets import stop_packet_snapshot
from runs import services, sql
from runs.actors import Actor
from runs.ledger import ledger_verify
from runs.models import ExecutionRecord, LedgerEntry, RunStatus, StopRequest
from tests.support.scenarios import reload, running, stopped_dirty

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
REVIEWER = Actor("user", "2", "bob")
# The transaction's opening and end (a savepoint under the test's transaction), the lock, the
# lease, the stop request, its drained and acknowledged updates, the lease release, two moves
# (ledger head, run update, ledger insert each), the open calls made unknown, the live lease,
# the dirty reasons (one statement), the stop request's outcome, then the packet: the existing
# one, eight reads, the stops that froze the outbox item, and its insert.
DRAINED_STATEMENTS = 29
# What the run lock is held for: the savepoint; the lock with the lease, the stop request and
# the ledger head (one pipeline); the stop request's two updates, the lease, the first move's
# run update and ledger insert, held back (`runs.sql.Deferred`) and sent ahead of the settle's
# UPDATE, two reads and the ledger head (one pipeline); the stop request's outcome and the
# second move's two, held back and sent ahead of the existing packet and the packet's eight
# reads (one pipeline); the stops that froze the outbox item, the packet's insert; the
# savepoint's release.
DRAINED_ROUND_TRIPS = 7


def _typical_stopped_run(team: Any) -> tuple[Any, Any]:
    """A run that did work, spent (priced and unpriced), held a call for approval and had
    steering queued; then stopped: cancel_requested, waiting for its worker's answer."""
    run, lease = running(team)
    services.events_ingest(
        run_id=run.pk,
        epoch=lease.epoch,
        actor=AGENT,
        events=[
            {
                "event_id": "u-1",
                "type": "usage",
                "model": "m-priced",
                "input_tokens": 10,
                "output_tokens": 5,
                "cost_usd": 0.25,
            },
            {
                "event_id": "u-2",
                "type": "usage",
                "model": "m-priced",
                "input_tokens": 1,
                "output_tokens": 2,
                "cost_usd": 0.5,
            },
            {
                "event_id": "u-3",
                "type": "usage",
                "model": "zz-no-such-model",
                "input_tokens": 7,
                "output_tokens": 3,
            },
        ],
    )
    services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="held-1",
        tool="wire_money",
        side_effect="write",
        actor=AGENT,
        needs_approval=True,
    )
    services.steering_queue(run_id=run.pk, text="use the EU endpoint", actor=REVIEWER)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    return reload(run), lease


def _drain(run: Any, lease: Any) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    return [query["sql"] for query in queries.captured_queries]


class RoundTrips:
    """Counts what a caller waits for: each statement sent on its own, and each pipeline
    (`runs.sql.pipelined`, whatever it holds) once."""

    def __init__(self, monkeypatch: Any) -> None:
        self.count = 0
        self._in_pipeline = False
        pipelined = sql.pipelined

        def counted(*statements: Any) -> Any:
            self.count += 1
            self._in_pipeline = True
            try:
                return pipelined(*statements)
            finally:
                self._in_pipeline = False

        monkeypatch.setattr(sql, "pipelined", counted)

    def __call__(self, execute: Any, sql_: str, params: Any, many: bool, context: Any) -> Any:
        if not self._in_pipeline:
            self.count += 1
        return execute(sql_, params, many, context)


def test_a_drained_answer_waits_for_at_most_its_round_trips(team, monkeypatch):
    run, lease = _typical_stopped_run(team)
    round_trips = RoundTrips(monkeypatch)

    with connection.execute_wrapper(round_trips):
        statements = _drain(run, lease)

    assert round_trips.count <= DRAINED_ROUND_TRIPS, "\n".join(statements)
    assert reload(run).status == RunStatus.STOPPED_CLEANLY


@pytest.mark.parametrize("prepared", [True, False], ids=["postgresql", "orm-as-on-sqlite"])
def test_a_write_in_flight_settles_dirty_the_same_way_on_both_paths(team, monkeypatch, prepared):
    # SQLite (`make run`) takes the ORM path: the same effects, a statement each.
    monkeypatch.setattr(sql, "prepared_statements", lambda: prepared)

    run = stopped_dirty(team)

    stop_request = StopRequest.objects.get(run=run)
    assert run.status == RunStatus.STOPPED_DIRTY
    assert stop_request.dirty_reasons == ["unconfirmed_side_effects"]
    record = ExecutionRecord.objects.get(run=run, side_effect="write")
    assert (record.execution_state, record.side_effect_state, record.observation_source) == (
        "unknown",
        "pending_verification",
        "stop",
    )
    assert record.observed_at == stop_request.stopped_at
    reads = ExecutionRecord.objects.filter(run=run).exclude(side_effect="write")
    assert {(read.execution_state, read.side_effect_state) for read in reads} == {
        ("succeeded", "none")
    }
    assert packet_of(run)["unconfirmed_side_effects"][0]["tool_call_id"] == record.tool_call_id
    assert ledger_verify(run_id=run.pk)[1] is None


def packet_of(run: Any) -> dict[str, Any]:
    snapshot: dict[str, Any] = StopPacket.objects.get(run=run, stop_epoch=run.stop_epoch).snapshot
    return snapshot


def test_a_drained_answer_sends_at_most_its_statements_and_settles_the_run(team):
    run, lease = _typical_stopped_run(team)

    statements = _drain(run, lease)

    assert len(statements) <= DRAINED_STATEMENTS, f"{len(statements)}:\n" + "\n".join(statements)
    stopped = reload(run)
    assert stopped.status == RunStatus.STOPPED_CLEANLY
    stop_request = StopRequest.objects.get(run=run)
    assert stop_request.outcome_state == RunStatus.STOPPED_CLEANLY
    assert stop_request.drained_at == stop_request.stopped_at is not None
    actions = list(
        LedgerEntry.objects.filter(run=run).order_by("run_seq").values_list("action", flat=True)
    )
    assert actions[-2:] == ["run.draining", "run.stopped_cleanly"]
    assert ledger_verify(run_id=run.pk)[1] is None
    packet = StopPacket.objects.get(run=run, stop_epoch=stopped.stop_epoch).snapshot
    cost = packet["cost"]
    assert cost["cost_usd_until_stop"] == 0.75
    assert (cost["tokens_until_stop"], cost["unpriced_tokens_until_stop"]) == (28, 10)
    assert [(row["model"], row["calls"]) for row in cost["by_model"]] == [
        ("m-priced", 2),
        ("zz-no-such-model", 1),
    ]
    assert [item["tool_call_id"] for item in packet["approvals_void_at_stop"]] == ["held-1"]
    assert [item["text"] for item in packet["unapplied_steering"]] == ["use the EU endpoint"]
    assert packet["lease_released"] and len(packet["leases"]) == 1
    assert packet["completed_steps"] and packet["artifacts"] and packet["outbox"]


def test_the_once_compiled_packet_is_the_orms_byte_for_byte(team, monkeypatch):
    run, lease = _typical_stopped_run(team)
    _drain(run, lease)
    stopped = reload(run)
    stop_request = StopRequest.objects.get(run=run)

    snapshots = {}
    for prepared in (True, False):
        monkeypatch.setattr(sql, "prepared_statements", lambda prepared=prepared: prepared)
        snapshots[prepared] = json.dumps(
            stop_packet_snapshot(stopped, stop_request), cls=DjangoJSONEncoder
        )

    assert snapshots[True] == snapshots[False]
    stored = StopPacket.objects.get(run=run, stop_epoch=stopped.stop_epoch).snapshot
    assert json.loads(snapshots[True]) == stored


# The worker's ack, which a worker that drains at once sends just before its `drained` (and
# the drained answer waits for its run lock): the savepoint; the lock with the stop request and
# the ledger head (one pipeline); the stop request's update, the run's, the ledger insert (one
# pipeline); the savepoint's release.
ACK_ROUND_TRIPS = 4


@pytest.mark.parametrize("prepared", [True, False], ids=["postgresql", "orm-as-on-sqlite"])
def test_an_ack_waits_for_at_most_its_round_trips_and_moves_the_run(team, monkeypatch, prepared):
    monkeypatch.setattr(sql, "prepared_statements", lambda: prepared)
    run, lease = running(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    round_trips = RoundTrips(monkeypatch)

    with connection.execute_wrapper(round_trips):
        acknowledged = services.run_acknowledge_stop(run_id=run.pk, actor=AGENT)

    if prepared:
        assert round_trips.count <= ACK_ROUND_TRIPS
    stop_request = StopRequest.objects.get(run=run)
    assert acknowledged.status == reload(run).status == RunStatus.DRAINING
    assert stop_request.acknowledged_at is not None
    assert stop_request.signal_delivered_at == stop_request.acknowledged_at
    entry = LedgerEntry.objects.filter(run=run).order_by("-run_seq").first()
    assert (entry.action, entry.reason, entry.payload["via"]) == (
        "run.draining",
        "worker_ack",
        "websocket",
    )
    assert ledger_verify(run_id=run.pk)[1] is None
    # A second ack finds the run draining already and changes nothing.
    services.run_acknowledge_stop(run_id=run.pk, actor=AGENT)
    assert LedgerEntry.objects.filter(run=run, action="run.draining").count() == 1


@pytest.mark.parametrize("prepared", [True, False], ids=["postgresql", "orm-as-on-sqlite"])
def test_an_ack_records_the_signals_delivery_in_the_same_round_trips(team, monkeypatch, prepared):
    monkeypatch.setattr(sql, "prepared_statements", lambda: prepared)
    run, lease = running(team)
    outcome = services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    written = timezone.now()
    round_trips = RoundTrips(monkeypatch)

    with connection.execute_wrapper(round_trips):
        services.run_acknowledge_stop(
            run_id=run.pk,
            actor=AGENT,
            delivered=services.SignalDelivery(
                stop_epoch=outcome.stop_request.epoch_after, at=written
            ),
        )

    if prepared:
        assert round_trips.count <= ACK_ROUND_TRIPS
    stop_request = StopRequest.objects.get(run=run)
    assert stop_request.signal_delivered_at == written < stop_request.acknowledged_at


def test_a_delivery_of_another_stop_is_not_recorded_by_the_ack(team):
    run, lease = running(team)
    outcome = services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    services.run_acknowledge_stop(
        run_id=run.pk,
        actor=AGENT,
        delivered=services.SignalDelivery(
            stop_epoch=outcome.stop_request.epoch_after - 1, at=timezone.now()
        ),
    )
    stop_request = StopRequest.objects.get(run=run)
    # An older stop's signal says nothing of this one: the ack's own time stands.
    assert stop_request.signal_delivered_at == stop_request.acknowledged_at
