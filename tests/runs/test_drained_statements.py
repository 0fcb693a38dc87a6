"""The worker's drained answer stays lean and its stop packet stays what it was.

`run_drained` settles the run and builds the stop packet under the run lock: every statement
it sends is time between the worker's answer and `stopped_cleanly`. The packet's reads are
compiled once per process (`runs.sql.OnceCompiled`); the packet they build must be the one the
ORM builds, byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection
from django.test.utils import CaptureQueriesContext

from handoff.models import StopPacket
from handoff.packets import stop_packet_snapshot
from runs import services, sql
from runs.actors import Actor
from runs.ledger import ledger_verify
from runs.models import LedgerEntry, RunStatus, StopRequest
from tests.support.scenarios import reload, running

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
REVIEWER = Actor("user", "2", "bob")
# The transaction's opening and end (a savepoint under the test's transaction), the lock, the
# lease, the stop request, its drained and acknowledged updates, the lease release, two moves
# (run update, ledger head, ledger insert each), the open calls, the live lease, three
# dirty-reason checks, the stop request's outcome, then the packet: the existing one, nine
# reads (one for the stops that froze the outbox item) and its insert. Was 33 before the stop
# request was read once and the cost was one read.
DRAINED_STATEMENTS = 31


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
