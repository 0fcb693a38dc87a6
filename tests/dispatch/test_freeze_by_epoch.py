"""Freezing by epoch: the stop writes no outbox row, yet from its commit on every reader sees the
run's pending items frozen — the claim, the packet, the console, the approval page, an enqueue
retry, /metrics, a reviewer's decision and the close — and the relabel writes later exactly
what they saw, in bounded batches."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.selectors.run import run_detail
from handoff.packets import stop_packet_snapshot
from runs import dispatch, frozen, selectors, services
from runs.actors import Actor
from runs.models import OutboxItem, OutboxStatus, RunStatus, StopRequest
from runs.selectors import queue_depths
from tests.support.run_factories import run_suspend
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
REVIEWER = Actor("user", "2", "bob")


@pytest.fixture(autouse=True)
def _hooks(settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]


def _enqueue(run, key: str, *, epoch: int | None = None) -> OutboxItem:
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch if epoch is None else epoch,
        transport="webhook",
        destination="https://hooks.example/x",
        payload={"key": key},
        idempotency_key=key,
        actor=AGENT,
    )
    return item


def _stopped_with_pending(team, count: int = 3):
    run, lease = make_running(team)
    items = [_enqueue(run, f"k{n}") for n in range(count)]
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    return reload(run), lease, items


def _raw(items) -> set[str]:
    return set(
        OutboxItem.objects.filter(pk__in=[i.pk for i in items]).values_list("status", flat=True)
    )


def test_every_reader_sees_the_stops_pending_items_frozen_before_any_row_is_relabelled(team):
    run, lease, items = _stopped_with_pending(team)
    assert _raw(items) == {OutboxStatus.PENDING}  # no row written by the stop
    stop = StopRequest.objects.get(run=run)

    # the dispatcher
    assert [services.outbox_claim(item_id=i.pk, dispatcher="d") for i in items] == [None] * 3
    assert dispatch.dispatch_pending() == 0
    # the packet (what a settle would write now)
    packet = stop_packet_snapshot(run, stop)
    assert sorted(packet["frozen_outbox_ids"]) == sorted(i.public_id for i in items)
    assert {entry["status"] for entry in packet["outbox"]} == {OutboxStatus.FROZEN}
    assert {entry["frozen_at"] for entry in packet["outbox"]} == {stop.requested_at.isoformat()}
    # the console's run page
    assert {item.status for item in run_detail(run).outbox} == {OutboxStatus.FROZEN}
    assert {item.frozen_by_epoch for item in run_detail(run).outbox} == {stop.epoch_after}
    # /metrics
    depths = queue_depths(team_ids=None)
    assert (depths["outbox_pending"], depths["outbox_frozen"]) == (0, 3)
    # an agent's retry of the same enqueue
    again, created = services.outbox_enqueue(
        run_id=run.pk,
        epoch=lease.epoch,
        transport="webhook",
        destination="https://hooks.example/x",
        payload={"key": "k0"},
        idempotency_key="k0",
        actor=AGENT,
    )
    assert not created and again.status == OutboxStatus.FROZEN
    assert _raw(items) == {OutboxStatus.PENDING}  # reading wrote nothing


def test_the_relabel_writes_what_readers_saw_in_bounded_batches_and_is_idempotent(team):
    run, _lease, items = _stopped_with_pending(team, 5)
    stop = StopRequest.objects.get(run=run)
    seen = {i.pk: (i.status, i.frozen_at, i.frozen_by_epoch) for i in run_detail(run).outbox}

    with CaptureQueriesContext(connection) as first:
        assert services.outbox_relabel_frozen(run_id=run.pk, limit=2) == 2
    assert services.outbox_relabel_frozen(run_id=run.pk, limit=2) == 2
    assert services.outbox_relabel_frozen(run_id=run.pk, limit=2) == 1
    assert services.outbox_relabel_frozen(run_id=run.pk, limit=2) == 0
    assert selectors.runs_with_frozen_by_epoch() == []

    # one short transaction: the lock, the lowest epoch, the stops, one UPDATE per stop, commit
    assert len(first.captured_queries) <= 8, [q["sql"] for q in first.captured_queries]
    rows = OutboxItem.objects.filter(run=run)
    assert {r.pk: (r.status, r.frozen_at, r.frozen_by_epoch) for r in rows} == seen
    assert {r.frozen_by_epoch for r in rows} == {stop.epoch_after}


def test_each_row_keeps_the_stop_that_froze_it_across_a_resume_and_a_second_stop(team):
    run, lease, first_items = _stopped_with_pending(team, 2)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    services.run_resume(run_id=run.pk, actor=REVIEWER)
    run = reload(run)
    second_lease = services.lease_acquire(
        run_id=run.pk, worker_id="w2", ttl_seconds=60, actor=AGENT
    )
    second = _enqueue(reload(run), "later", epoch=second_lease.epoch)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    run = reload(run)
    stops = dict(StopRequest.objects.filter(run=run).values_list("epoch_after", "requested_at"))
    assert len(stops) == 2
    first_epoch, second_epoch = sorted(stops)

    seen = {i.pk: (i.frozen_by_epoch, i.frozen_at) for i in run_detail(run).outbox}
    assert seen == {
        **{i.pk: (first_epoch, stops[first_epoch]) for i in first_items},
        second.pk: (second_epoch, stops[second_epoch]),
    }
    assert dispatch.relabel_frozen(run_id=run.pk) == 3
    assert {
        r.pk: (r.frozen_by_epoch, r.frozen_at) for r in OutboxItem.objects.filter(run=run)
    } == seen


def test_a_reviewer_releases_or_discards_an_item_frozen_by_epoch_and_close_discards_the_rest(
    team,
):
    run, lease, items = _stopped_with_pending(team, 3)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    assert reload(run).status == RunStatus.STOPPED_CLEANLY

    released = services.outbox_release(run_id=run.pk, item_id=items[0].pk, actor=REVIEWER)
    discarded = services.outbox_discard(run_id=run.pk, item_id=items[1].pk, actor=REVIEWER)

    assert (released.status, discarded.status) == (OutboxStatus.RELEASED, OutboxStatus.DISCARDED)
    stop = StopRequest.objects.get(run=run)
    for item in (released, discarded):
        item.refresh_from_db()
        assert (item.frozen_by_epoch, item.frozen_at) == (stop.epoch_after, stop.requested_at)
    services.run_close(run_id=run.pk, actor=REVIEWER)
    items[2].refresh_from_db()
    assert items[2].status == OutboxStatus.DISCARDED


def test_a_suspension_after_a_stop_and_resume_does_not_revive_the_frozen_items(team):
    run, lease, items = _stopped_with_pending(team, 2)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    services.run_resume(run_id=run.pk, actor=REVIEWER)
    second_lease = services.lease_acquire(
        run_id=run.pk, worker_id="w2", ttl_seconds=60, actor=AGENT
    )
    waiting = _enqueue(reload(run), "waits", epoch=second_lease.epoch)
    run_suspend(run_id=run.pk, epoch=second_lease.epoch, actor=AGENT, reason="waits")
    services.run_resume(run_id=run.pk, actor=REVIEWER)
    run = reload(run)

    waiting.refresh_from_db()
    assert (waiting.status, waiting.enqueue_epoch) == (OutboxStatus.PENDING, run.stop_epoch)
    assert {
        i.status
        for i in frozen.present(run, OutboxItem.objects.filter(pk__in=[i.pk for i in items]))
    } == {OutboxStatus.FROZEN}
