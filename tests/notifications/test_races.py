"""Exactly one delivery per subscribed channel, with real threads on PostgreSQL: an event
retried by two workers at once, and two senders racing for the same rows."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from notifications import services as notify
from notifications.models import Delivery
from runs import services
from runs.actors import Actor
from runs.models import Approval, Run
from tests.support.scenarios import AGENT, SYSTEM, new_run, running, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WORKERS = 4


def _race(*calls: Callable[[], Any]) -> list[Any]:
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - returned and asserted by the caller
            return error
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [future.result(timeout=60) for future in [pool.submit(run, c) for c in calls]]


@pytest.fixture
def two_channels(team, receiver, make_channel):
    first, secret = make_channel(team, receiver.url("/one"), name="one")
    second, _ = make_channel(team, receiver.url("/two"), name="two")
    receiver.secret = secret
    return first, second


def _per_channel(event: str) -> dict[int, int]:
    counts: dict[int, int] = {}
    for channel_id in Delivery.objects.filter(event=event).values_list("channel_id", flat=True):
        counts[channel_id] = counts.get(channel_id, 0) + 1
    return counts


def test_a_drain_deadline_fenced_by_two_watchdogs_notifies_once_per_channel(
    team, two_channels, settings
):
    settings.SAFESTOP_DRAIN_DEADLINE_SECONDS = 0
    run, _lease = running(team, write_open=True)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM)
    results = _race(*[lambda: services.run_fence_overdue(run_id=run.pk)] * WORKERS)
    assert results.count(True) == 1
    assert Run.objects.get(pk=run.pk).status == "stopped_dirty"
    assert _per_channel("drain.deadline_passed") == {c.pk: 1 for c in two_channels}


def test_an_approval_expired_by_two_workers_notifies_once_per_channel(team, two_channels):
    run = new_run(team)
    start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="charge_1",
        tool="payments.charge",
        side_effect="write",
        actor=AGENT,
        needs_approval=True,
    )
    approval = Approval.objects.get(run=run)
    later = approval.deadline + timedelta(seconds=1)
    results = _race(
        *[lambda: services.approval_expire(approval_id=approval.pk, now=later)] * WORKERS
    )
    assert results.count(True) == 1
    assert _per_channel("approval.expired") == {c.pk: 1 for c in two_channels}
    assert _per_channel("approval.waiting") == {c.pk: 1 for c in two_channels}


def test_a_handoff_taken_over_twice_at_once_notifies_once_per_channel(team, two_channels):
    run, lease = running(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM)
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
    )
    bob = Actor("user", "2", "bob")
    _race(*[lambda: services.run_takeover(run_id=run.pk, actor=bob, note="mine")] * WORKERS)
    assert Run.objects.get(pk=run.pk).status == "handed_off"
    assert _per_channel("handoff.waiting") == {c.pk: 1 for c in two_channels}


def test_two_senders_never_send_the_same_delivery_twice(team, two_channels, receiver):
    for _ in range(5):
        run, lease = running(team, write_open=True)
        services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM)
        services.run_drained(
            run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
        )
    assert Delivery.objects.filter(status="pending").count() == 10
    sent = _race(
        *[
            lambda n=n: notify.deliveries_send_due(limit=100, sender=f"sender-{n}")
            for n in range(WORKERS)
        ]
    )
    assert sum(sent) == 10
    assert len(receiver.ids()) == 10 and len(set(receiver.ids())) == 10
    assert all(hit.verified for hit in receiver.hits if hit.path == "/one")  # its secret
    assert Delivery.objects.filter(status="sent", sent_at__lte=timezone.now()).count() == 10
