"""The embedded default's background loop: one thread running the same dispatch and reapers."""

from __future__ import annotations

import time

import pytest

from runs import background, dispatch, services
from runs.actors import Actor
from runs.models import OutboxItem, OutboxStatus, RunStatus
from tests.support.scenarios import make_running, reload

AGENT = Actor.system("agent")

pytestmark = pytest.mark.django_db(transaction=True)


def _wait(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _enqueue(run, receiver, key: str) -> OutboxItem:
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="webhook",
        destination=receiver.url(),
        payload={"key": key},
        idempotency_key=key,
        actor=AGENT,
    )
    return item


def _status(item: OutboxItem) -> str:
    return OutboxItem.objects.values_list("status", flat=True).get(pk=item.pk)


def test_the_loop_dispatches_reaps_and_stops_cleanly(team, receiver, settings) -> None:
    settings.SAFESTOP_DISPATCH_DEADLINE_SECONDS = 0.3
    run, _lease = make_running(team)
    doomed, _ = make_running(team, ttl=0.3)  # its worker will vanish
    stuck = _enqueue(run, receiver, "stuck")
    services.outbox_claim(item_id=stuck.pk, dispatcher="a-dead-dispatcher")

    loop = background.start_background_thread(interval=0.05)
    try:
        assert loop.is_alive
        item = _enqueue(run, receiver, "k-1")
        assert _wait(lambda: _status(item) == OutboxStatus.SENT)
        assert _wait(lambda: reload(doomed).status == RunStatus.INTERRUPTED)
        assert _wait(lambda: _status(stuck) == OutboxStatus.UNKNOWN)
        assert loop.wait_for_ticks(2)
    finally:
        assert loop.stop(timeout=5) is True

    assert not loop.is_alive
    assert receiver.keys() == ["k-1"]  # the stuck item was reaped, never sent
    ticks = loop.ticks
    late = _enqueue(run, receiver, "after-stop")
    time.sleep(0.3)
    assert loop.ticks == ticks
    assert _status(late) == OutboxStatus.PENDING


def test_an_enqueue_wakes_the_loop_before_its_interval(team, receiver) -> None:
    run, _lease = make_running(team)
    loop = background.start_background_thread(interval=30)
    try:
        assert loop.wait_for_ticks(1)  # the first tick runs at once; the next one is 30 s away
        started = time.monotonic()
        item = _enqueue(run, receiver, "fast")
        assert _wait(lambda: _status(item) == OutboxStatus.SENT, timeout=5)
        assert time.monotonic() - started < 5
    finally:
        assert loop.stop(timeout=5) is True


def test_an_exception_in_a_tick_is_logged_and_the_loop_carries_on(
    team, receiver, monkeypatch, caplog
) -> None:
    calls = {"n": 0}
    real = dispatch.reap_expired_leases

    def explode() -> int:
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("database went away")
        return real()

    monkeypatch.setattr(dispatch, "reap_expired_leases", explode)
    run, _lease = make_running(team)
    loop = background.start_background_thread(interval=0.05)
    try:
        item = _enqueue(run, receiver, "still-sent")
        assert _wait(lambda: _status(item) == OutboxStatus.SENT)
        assert loop.wait_for_ticks(3)
    finally:
        assert loop.stop(timeout=5) is True
    assert loop.errors >= 2
    assert calls["n"] >= 3
    assert "database went away" in caplog.text


def test_the_loop_is_for_the_embedded_default_only(settings) -> None:
    settings.REDIS_URL = ""
    assert background.background_runs_in_process() is True
    settings.REDIS_URL = "redis://127.0.0.1:6379/5"
    assert background.background_runs_in_process() is False
