"""The stop's write path stays lean and does all it did (docs/BENCHMARKS.md).

A stop of a running run is the run lock, one statement for the stop's writes and reads, and the
ledger entry: a change that brings back per-statement ORM work fails the statement count here,
and each test also checks what the one statement must still do (freeze, flag, mark, chain).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import frozen, services, sql
from runs.actors import Actor
from runs.ledger import ledger_verify
from runs.models import (
    Approval,
    ApprovalStatus,
    ExecutionRecord,
    LedgerEntry,
    OutboxItem,
    OutboxStatus,
    RemoteCancelState,
    RunStatus,
    SteeringMessage,
    SteeringStatus,
    StopRequest,
)
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
REVIEWER = Actor("user", "2", "bob")
# BEGIN, the run lock, the stop's one statement, the ledger entry, COMMIT.
STOP_STATEMENTS = 5


def _busy_running_run(team: Any) -> tuple[Any, Any]:
    """A running run with what a stop must act on: pending items, a call in flight, steering."""
    run, lease = make_running(team)
    for n in range(3):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=lease.epoch,
            transport="email",
            destination=f"ops{n}@example.com",
            payload={"n": n},
            idempotency_key=f"mail-{n}",
            actor=AGENT,
        )
    services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="call-1",
        tool="charge_card",
        side_effect="write",
        actor=AGENT,
    )
    services.steering_queue(run_id=run.pk, text="use the EU endpoint", actor=REVIEWER)
    return run, lease


def _statements(call: Any) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        answer = call()
    return answer, [query["sql"] for query in queries.captured_queries]


@pytest.mark.parametrize("prepared", [True, False], ids=["postgresql", "orm-as-on-sqlite"])
def test_a_stop_is_five_statements_and_does_everything_a_stop_does(team, monkeypatch, prepared):
    # SQLite (`make run`) takes the ORM path: the same effects, a statement each.
    monkeypatch.setattr(sql, "prepared_statements", lambda: prepared)
    run, lease = _busy_running_run(team)
    run = reload(run)

    outcome, statements = _statements(
        lambda: services.run_stop(
            run_id=run.pk, reason="user_stop", actor=REVIEWER, note="wrong", bulk_id="bulk_1"
        )
    )

    if prepared:
        assert len(statements) == STOP_STATEMENTS, "\n".join(statements)
    assert outcome.created and outcome.status == RunStatus.CANCEL_REQUESTED
    assert outcome.stop_epoch == lease.epoch + 1
    stopped = reload(run)
    assert stopped.status == RunStatus.CANCEL_REQUESTED
    assert stopped.stop_epoch == lease.epoch + 1
    assert (stopped.stop_reason, stopped.stop_requested_by) == ("user_stop", "bob")
    assert stopped.change_seq == run.change_seq + 1
    stop_request = StopRequest.objects.get(run=run)
    assert stop_request.pk == outcome.stop_request.pk
    assert (stop_request.epoch_before, stop_request.epoch_after) == (lease.epoch, lease.epoch + 1)
    assert (stop_request.note, stop_request.signal, stop_request.dirty_reasons) == (
        "wrong",
        "cancel_requested",
        [],
    )
    # Frozen by the new epoch: no outbox row is written by the stop, every reader sees them
    # frozen, and the relabel writes what the readers saw.
    outbox_update = f'UPDATE "{OutboxItem._meta.db_table}"'
    assert not [text for text in statements if outbox_update in text], statements
    rows = list(OutboxItem.objects.filter(run=run))
    assert {item.status for item in rows} == {OutboxStatus.PENDING}
    seen = frozen.present(stopped, OutboxItem.objects.filter(run=run))
    assert {(item.status, item.frozen_by_epoch) for item in seen} == {
        (OutboxStatus.FROZEN, lease.epoch + 1)
    }
    assert {item.frozen_at for item in seen} == {stop_request.requested_at}
    assert services.outbox_relabel_frozen(run_id=run.pk) == 3
    relabelled = list(OutboxItem.objects.filter(run=run))
    assert {(item.status, item.frozen_by_epoch, item.frozen_at) for item in relabelled} == {
        (OutboxStatus.FROZEN, lease.epoch + 1, stop_request.requested_at)
    }
    record = ExecutionRecord.objects.get(run=run, tool_call_id="call-1")
    assert record.cancel_requested
    assert record.remote_cancel_state == RemoteCancelState.REQUESTED
    steering = SteeringMessage.objects.get(run=run)
    assert steering.status == SteeringStatus.UNAPPLIED_AT_STOP
    entry = LedgerEntry.objects.filter(run=run).order_by("-run_seq").first()
    assert entry is not None and entry.action == "run.stop_requested"
    assert entry.payload["frozen_outbox"] == 3
    assert entry.payload["bulk_id"] == "bulk_1"
    assert entry.payload["stop_request_id"] == stop_request.pk
    assert (entry.payload["from"], entry.payload["to"]) == ("running", "cancel_requested")
    assert ledger_verify(run_id=run.pk)[1] is None


def test_a_repeated_stop_writes_nothing(team):
    run, _lease = _busy_running_run(team)
    first = services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    entries = LedgerEntry.objects.filter(run=run).count()

    again = services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    assert not again.created and again.stop_request.pk == first.stop_request.pk
    assert StopRequest.objects.filter(run=run).count() == 1
    assert LedgerEntry.objects.filter(run=run).count() == entries


def test_a_stop_that_voids_an_approval_chains_its_entry_after_the_voiding(team):
    run, lease = make_running(team)
    services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="held-1",
        tool="wire_money",
        side_effect="write",
        actor=AGENT,
        needs_approval=True,
    )

    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    approval = Approval.objects.get(run=run)
    assert approval.status == ApprovalStatus.VOID
    actions = list(
        LedgerEntry.objects.filter(run=run).order_by("run_seq").values_list("action", flat=True)
    )
    assert actions[-2:] == ["approval.voided", "run.stop_requested"]
    entry = LedgerEntry.objects.filter(run=run).order_by("-run_seq").first()
    assert entry is not None and entry.payload["approvals_voided"] == [approval.public_id]
    assert ledger_verify(run_id=run.pk)[1] is None


def test_a_stop_without_a_live_lease_settles_in_its_own_transaction(team):
    run, lease = make_running(team)
    services.lease_release(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)

    outcome = services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    assert outcome.status == RunStatus.STOPPED_CLEANLY
    stop_request = StopRequest.objects.get(run=run)
    assert stop_request.drained_at is not None and stop_request.stopped_at is not None
    assert ledger_verify(run_id=run.pk)[1] is None


def test_the_worker_is_signalled_before_viewers_hear_of_the_change(
    team, monkeypatch, django_capture_on_commit_callbacks
):
    run, _lease = make_running(team)
    heard: list[str] = []
    monkeypatch.setattr(
        "runs.notify._listeners", [lambda event: heard.append(event["type"])], raising=True
    )

    with django_capture_on_commit_callbacks(execute=True):
        services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    assert heard == ["stop.signal", "run.updated"]
