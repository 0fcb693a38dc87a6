"""The committing process dispatches its own enqueue (runs/local_dispatch.py), on real
PostgreSQL, with no Celery worker running: the broker only hears of what it leaves."""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator

import pytest

from runs import dispatch, notify, services, tasks
from runs.actors import Actor
from runs.local_dispatch import LocalDispatcher
from runs.models import LedgerEntry, OutboxItem, OutboxStatus
from tests.support.scenarios import make_running, outbox_seen

AGENT = Actor.system("agent")
REVIEWER = Actor.system("reviewer-bob")

pytestmark = pytest.mark.django_db(transaction=True)


class Broker:
    """Stands in for Celery's `apply_async` of the kicks: records them; `hold` makes every
    publish block until released, as a broker that does not answer would."""

    def __init__(self) -> None:
        self.queued: list[tuple[str, dict]] = []
        self.hold = threading.Event()
        self.hold.set()

    def recorder(self, name: str):
        def apply_async(**options) -> None:
            self.hold.wait()
            self.queued.append((name, options))

        return apply_async

    def names(self) -> list[str]:
        return [name for name, _options in self.queued]

    def wait_for_names(self, names: list[str], timeout: float = 10.0) -> bool:
        """The kicker thread publishes after the commit: wait until it has."""
        deadline = time.monotonic() + timeout
        while self.names() != names and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.names() == names


@pytest.fixture
def broker(monkeypatch) -> Broker:
    recorded = Broker()
    for name in ("dispatch_pending", "schedule_wake", "relabel_frozen_outbox"):
        monkeypatch.setattr(getattr(tasks, name), "apply_async", recorded.recorder(name))
    return recorded


@pytest.fixture
def local(monkeypatch, broker) -> Iterator[LocalDispatcher]:
    """The kick on commit, installed as `runs.apps` installs it with REDIS_URL, with a fresh
    dispatcher of this process (closed after the test, so it claims nothing during teardown)."""
    dispatcher = LocalDispatcher()
    monkeypatch.setattr(tasks, "local_dispatcher", dispatcher)
    tasks.install_dispatch_kick()
    try:
        yield dispatcher
    finally:
        tasks.uninstall_dispatch_kick()
        broker.hold.set()
        assert dispatcher.close(timeout=20)


def _enqueue(run, receiver, key: str, path: str = "/ok") -> OutboxItem:
    item, _created = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="webhook",
        destination=receiver.url(path),
        payload={"key": key},
        idempotency_key=key,
        actor=AGENT,
    )
    return item


def _claimed_by(item: OutboxItem) -> str:
    return OutboxItem.objects.values_list("claimed_by", flat=True).get(pk=item.pk)


def test_an_enqueue_is_claimed_and_sent_by_the_committing_process_with_no_worker(
    team, receiver, local, broker
) -> None:
    run, _lease = make_running(team)

    item = _enqueue(run, receiver, "here-1")

    assert receiver.wait_for(1, timeout=20)
    assert local.wait_for_batches(1)
    item.refresh_from_db()
    assert item.status == OutboxStatus.SENT
    assert item.claimed_by.split(":")[1:] == [str(os.getpid()), "safestop-local-dispatch"]
    assert receiver.keys() == ["here-1"]
    assert "dispatch_pending" not in broker.names()  # nothing was left for a Celery worker


def test_an_item_the_stop_froze_is_never_dispatched_by_the_committing_process(
    team, receiver, local, broker
) -> None:
    run, _lease = make_running(team)
    with notify.held() as events:  # the enqueue's wake comes after the stop committed
        _enqueue(run, receiver, "frozen-1")
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    notify.deliver(events)

    assert local.wait_for_batches(1)
    [item] = outbox_seen(run)
    assert item.status == OutboxStatus.FROZEN and item.claimed_at is None
    assert receiver.count() == 0
    assert "dispatch_pending" not in broker.names()


def test_what_a_batch_cannot_finish_is_handed_to_the_celery_worker(
    team, receiver, monkeypatch, broker
) -> None:
    dispatcher = LocalDispatcher(limit=2)
    monkeypatch.setattr(tasks, "local_dispatcher", dispatcher)
    run, _lease = make_running(team)
    tasks.install_dispatch_kick()
    try:
        with notify.held() as events:
            for n in range(3):
                _enqueue(run, receiver, f"rest-{n}")
        notify.deliver(events[-1:])  # one wake for the three
        assert dispatcher.wait_for_batches(1)
    finally:
        tasks.uninstall_dispatch_kick()
        assert dispatcher.close(timeout=20)

    # The item its wake named first (by its id), then the queue's oldest.
    assert receiver.keys() == ["rest-2", "rest-0"]
    assert OutboxItem.objects.filter(run=run, status=OutboxStatus.PENDING).count() == 1
    assert broker.wait_for_names(["dispatch_pending"])
    [(_name, options)] = broker.queued
    assert options == {"kwargs": {"limit": tasks.KICK_LIMIT}, "retry": False, "expires": 60}
    assert dispatch.dispatch_pending() == 1  # the worker's share, claimed as any dispatcher does


def test_a_broker_that_never_answers_holds_up_neither_the_enqueue_nor_its_dispatch(
    team, receiver, local, broker
) -> None:
    """Every publish blocks until the test ends: the stop's kick is stuck in the broker, and
    the enqueues after it still return and go out."""
    broker.hold.clear()
    stopped, _lease = make_running(team)
    services.run_stop(run_id=stopped.pk, reason="user_stop", actor=REVIEWER)  # kicks a wake
    run, _lease2 = make_running(team)

    _enqueue(run, receiver, "stuck-broker-1")
    _enqueue(run, receiver, "stuck-broker-2")

    assert receiver.wait_for(2, timeout=20)
    assert sorted(receiver.keys()) == ["stuck-broker-1", "stuck-broker-2"]
    assert broker.queued == []  # the stop's kicks are still waiting on the broker


def test_the_committing_process_and_other_dispatchers_send_each_item_once(
    team, receiver, local
) -> None:
    """Two dispatcher threads (a worker's, another process's) race this process's own: every
    item goes out exactly once, whoever claims it."""
    run, _lease = make_running(team)
    stop = threading.Event()

    def other_dispatcher() -> None:
        from django.db import connections

        try:
            while not stop.is_set():
                if dispatch.dispatch_pending(limit=5) == 0:
                    stop.wait(0.002)
        finally:
            connections.close_all()

    others = [threading.Thread(target=other_dispatcher) for _ in range(2)]
    for thread in others:
        thread.start()
    try:
        keys = [f"race-{n}" for n in range(30)]
        for key in keys:
            _enqueue(run, receiver, key)
        assert receiver.wait_for(len(keys), timeout=60)
    finally:
        stop.set()
        for thread in others:
            thread.join(20)
    assert local.close(timeout=20)  # its last outcome is recorded

    assert sorted(receiver.keys()) == sorted(keys)
    assert receiver.duplicates() == {}
    statuses = set(OutboxItem.objects.filter(run=run).values_list("status", flat=True))
    assert statuses == {OutboxStatus.SENT}


def test_a_closed_dispatcher_claims_nothing_more(team, receiver, local) -> None:
    """At exit (atexit calls `close`) the thread stops claiming; the sweep sends the rest."""
    run, _lease = make_running(team)
    _enqueue(run, receiver, "before-exit-1")
    assert receiver.wait_for(1, timeout=20) and local.wait_for_batches(1)

    assert local.close(timeout=5)
    assert local.wait_until_stopped(timeout=10)
    item = _enqueue(run, receiver, "after-exit-1")

    assert not local.is_alive
    assert _claimed_by(item) == ""
    assert OutboxItem.objects.get(pk=item.pk).status == OutboxStatus.PENDING
    assert receiver.keys() == ["before-exit-1"]


def test_an_enqueue_racing_a_stop_is_claimed_before_it_or_frozen_by_it(
    team, receiver, local
) -> None:
    """The stop commits right after the enqueue, while this process's dispatcher claims: the
    ledger, written under the run lock, shows every claim before its run's stop, and every item
    not claimed is frozen and never received."""
    rng = random.Random(7)
    runs = []
    for n in range(12):
        run, _lease = make_running(team)
        _enqueue(run, receiver, f"stop-race-{n}")
        time.sleep(rng.random() * 0.01)  # the stop lands anywhere in the claim's window
        services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
        runs.append(run)
    assert local.close(timeout=20)

    claimed_keys = []
    for run in runs:
        actions = list(
            LedgerEntry.objects.filter(run=run).order_by("run_seq").values_list("action", flat=True)
        )
        stop_at = actions.index("run.stop_requested")
        assert "outbox.claimed" not in actions[stop_at:], actions
        [item] = outbox_seen(run)
        if "outbox.claimed" in actions:
            claimed_keys.append(item.idempotency_key)
        else:
            assert item.status == OutboxStatus.FROZEN and item.claimed_at is None
    assert sorted(receiver.keys()) == sorted(claimed_keys)
    assert receiver.duplicates() == {}
