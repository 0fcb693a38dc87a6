"""Dispatch through the services: claim → send outside any transaction → record the outcome."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from handoff.models import StopPacket
from runs import dispatch, frozen, services, tasks
from runs.actors import Actor
from runs.models import LedgerEntry, OutboxItem, OutboxStatus, RunStatus
from tests.support.scenarios import make_running, reload

AGENT = Actor.system("agent")
REVIEWER = Actor.system("reviewer-bob")

pytestmark = pytest.mark.django_db(transaction=True)


def _enqueue_many(run, receiver, count: int, path: str = "/ok") -> list[OutboxItem]:
    items = []
    for seq in range(count):
        item, _created = services.outbox_enqueue(
            run_id=run.pk,
            epoch=run.stop_epoch,
            transport="webhook",
            destination=receiver.url(path),
            payload={"seq": seq},
            idempotency_key=f"{run.pk}-{seq}",
            actor=AGENT,
        )
        items.append(item)
    return items


def _actions(run) -> list[str]:
    return list(
        LedgerEntry.objects.filter(run=run).order_by("run_seq").values_list("action", flat=True)
    )


def test_dispatch_one_sends_and_records_the_outcome_with_a_ledger_trail(team, receiver) -> None:
    run, _lease = make_running(team)
    [item] = _enqueue_many(run, receiver, 1)

    settled = dispatch.dispatch_one(item)

    assert settled is not None
    assert settled.status == OutboxStatus.SENT
    assert settled.response_status == 200
    assert settled.sent_at is not None and settled.claimed_at is not None
    assert settled.claim_epoch == run.stop_epoch
    assert receiver.keys() == [item.idempotency_key]
    assert receiver.receipts[0].body == {"seq": 0}
    actions = _actions(run)
    assert actions[-3:] == ["outbox.enqueued", "outbox.claimed", "outbox.sent"]


def test_items_frozen_by_a_stop_are_never_sent(team, receiver) -> None:
    run, _lease = make_running(team)
    items = _enqueue_many(run, receiver, 3)

    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    assert dispatch.dispatch_pending() == 0
    assert [dispatch.dispatch_one(item) for item in items] == [None, None, None]
    assert receiver.count() == 0
    stopped = reload(run)
    seen = frozen.present(stopped, OutboxItem.objects.filter(run=run))
    assert {item.status for item in seen} == {OutboxStatus.FROZEN}
    # Relabelled later, in bounded batches: still never sent.
    assert services.outbox_relabel_frozen(run_id=run.pk, limit=2) == 2
    assert services.outbox_relabel_frozen(run_id=run.pk, limit=2) == 1
    assert services.outbox_relabel_frozen(run_id=run.pk, limit=2) == 0
    statuses = set(OutboxItem.objects.filter(run=run).values_list("status", flat=True))
    assert statuses == {OutboxStatus.FROZEN}
    assert dispatch.dispatch_pending() == 0 and receiver.count() == 0


def test_a_scan_read_before_the_stop_cannot_send_after_it(team, receiver) -> None:
    """The seed's failure case: the dispatcher found ready messages by the old state, the user
    pressed Stop, and the dispatcher went on to send them. Here its claim re-reads the run."""
    run, _lease = make_running(team)
    _enqueue_many(run, receiver, 4)
    stale_scan = list(
        OutboxItem.objects.filter(run=run, status="pending").values_list("pk", flat=True)
    )
    assert len(stale_scan) == 4

    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    assert [dispatch.dispatch_one(item_id) for item_id in stale_scan] == [None] * 4
    assert receiver.count() == 0


def test_dispatch_pending_sends_oldest_first_and_respects_the_limit(team, receiver) -> None:
    run, _lease = make_running(team)
    items = _enqueue_many(run, receiver, 5)

    assert dispatch.dispatch_pending(limit=3) == 3
    assert receiver.keys() == [item.idempotency_key for item in items[:3]]
    assert dispatch.dispatch_pending(limit=10) == 2
    assert dispatch.dispatch_pending(limit=10) == 0
    assert receiver.keys() == [item.idempotency_key for item in items]


def test_a_redelivered_dispatch_task_does_not_send_twice(team, receiver) -> None:
    """acks_late means a task may run twice; the claim, not Celery, prevents the second send."""
    run, _lease = make_running(team)
    [item] = _enqueue_many(run, receiver, 1)

    assert tasks.dispatch_outbox_item(item.pk) == OutboxStatus.SENT
    assert tasks.dispatch_outbox_item(item.pk) is None
    assert receiver.count(item.idempotency_key) == 1


def test_a_released_item_goes_out_once_and_a_discarded_one_never(team, receiver) -> None:
    run, lease = make_running(team)
    kept, dropped = _enqueue_many(run, receiver, 2)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    assert reload(run).status == RunStatus.STOPPED_CLEANLY
    assert dispatch.dispatch_pending() == 0

    services.outbox_release(
        run_id=run.pk, item_id=kept.pk, actor=REVIEWER, note="customer asked for it"
    )
    services.outbox_discard(run_id=run.pk, item_id=dropped.pk, actor=REVIEWER)

    assert dispatch.dispatch_pending() == 1
    assert dispatch.dispatch_pending() == 0
    assert receiver.keys() == [kept.idempotency_key]
    kept.refresh_from_db()
    dropped.refresh_from_db()
    assert (kept.status, dropped.status) == (OutboxStatus.SENT, OutboxStatus.DISCARDED)
    assert {"outbox.released", "outbox.discarded"} <= set(_actions(run))


def test_a_transport_timeout_leaves_the_item_unknown_never_resent_and_the_stop_dirty(
    team, receiver, settings
) -> None:
    settings.SAFESTOP_WEBHOOK_READ_TIMEOUT = 0.2
    run, lease = make_running(team)
    [item] = _enqueue_many(run, receiver, 1, path="/slow/0.6")

    settled = dispatch.dispatch_one(item)

    assert settled is not None and settled.status == OutboxStatus.UNKNOWN
    assert dispatch.dispatch_pending() == 0
    assert dispatch.dispatch_one(item) is None
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run = reload(run)
    assert run.status == RunStatus.STOPPED_DIRTY
    packet = StopPacket.objects.get(run=run, stop_epoch=run.stop_epoch)
    assert packet.snapshot["in_flight_outbox_ids"] == [item.public_id]
    assert "outbox_in_flight" in packet.snapshot["dirty_reasons"]
    assert receiver.count(item.idempotency_key) == 1


def test_a_time_bounded_dispatch_leaves_the_rest_for_the_next_tick(team, receiver) -> None:
    run, _lease = make_running(team)
    items = _enqueue_many(run, receiver, 5, path="/slow/0.3")

    sent_now = dispatch.dispatch_pending(limit=100, max_seconds=0.5)

    assert 1 <= sent_now < 5
    assert OutboxItem.objects.filter(run=run, status=OutboxStatus.PENDING).count() == 5 - sent_now
    assert dispatch.dispatch_pending(limit=100) == 5 - sent_now
    assert receiver.keys() == [item.idempotency_key for item in items]


def test_items_stranded_by_an_interruption_do_not_starve_the_dispatcher(team, receiver) -> None:
    """A run interrupted (lease expired) with pending items, then resumed at a new epoch: its old
    items are frozen by the interruption (a reviewer may release them), are never claimed on
    their own, and must not hide newer items from the dispatcher's scan."""
    run, lease = make_running(team, ttl=3)
    stranded = _enqueue_many(run, receiver, 25)
    time.sleep(max(0.0, (lease.expires_at - timezone.now()).total_seconds()) + 0.1)
    assert dispatch.reap_expired_leases() == 1
    services.run_resume(run_id=run.pk, actor=REVIEWER)
    services.lease_acquire(run_id=run.pk, worker_id="worker-2", ttl_seconds=30, actor=AGENT)
    other, _lease2 = make_running(team)
    [fresh] = _enqueue_many(other, receiver, 1)

    assert dispatch.dispatch_pending() == 1
    assert receiver.keys() == [fresh.idempotency_key]
    assert all(
        _status == OutboxStatus.FROZEN
        for _status in OutboxItem.objects.filter(pk__in=[i.pk for i in stranded]).values_list(
            "status", flat=True
        )
    )
