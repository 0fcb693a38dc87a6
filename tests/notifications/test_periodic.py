"""The periodic checks: a handoff still waiting, and a ledger whose chain is broken."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from handoff.models import Handoff
from notifications import periodic
from notifications import services as notify
from notifications.models import Delivery
from runs import ledger_checks
from runs.actors import Actor
from runs.models import LedgerEntry, LedgerVerification
from tests.support.ledger import behind_the_triggers
from tests.support.scenarios import handed_off, stopped_dirty
from tests.support.stack import wait_until

pytestmark = pytest.mark.django_db

BOB = Actor("user", "2", "bob")


def test_a_handoff_nobody_accepted_is_announced_again_once(team, webhook, settings):
    settings.SAFESTOP_HANDOFF_REMIND_SECONDS = 600
    run = handed_off(team, by=BOB)
    handoff = Handoff.objects.get(run=run)
    assert Delivery.objects.filter(event="handoff.waiting").count() == 1  # when it opened
    assert notify.handoffs_remind_waiting() == 0  # not waiting long enough yet
    Handoff.objects.filter(pk=handoff.pk).update(created_at=timezone.now() - timedelta(hours=1))
    assert notify.handoffs_remind_waiting() == 1
    assert notify.handoffs_remind_waiting() == 0  # once per handoff
    reminder = Delivery.objects.get(event_key=f"handoff.waiting:{handoff.pk}:still-waiting")
    assert reminder.message["title"].startswith("Handoff still waiting")
    assert reminder.message["link"].endswith(f"/handoffs/#handoff-{handoff.pk}")
    assert ["Waiting for", "60 min"] in reminder.message["facts"]


def test_an_accepted_handoff_is_not_announced_again(team, webhook, bob):
    from handoff.services import handoff_accept

    run = handed_off(team, by=BOB)
    handoff = Handoff.objects.get(run=run)
    handoff_accept(handoff_id=handoff.pk, user=bob, actor=Actor.for_user(bob))
    Handoff.objects.filter(pk=handoff.pk).update(created_at=timezone.now() - timedelta(days=1))
    assert notify.handoffs_remind_waiting() == 0


def test_a_broken_ledger_chain_is_delivered_once(team, other_team, webhook, make_channel, receiver):
    other_channel, _ = make_channel(other_team, receiver.url("/other"))
    run = stopped_dirty(team)
    assert notify.ledger_check() is None
    Delivery.objects.all().delete()
    target = LedgerEntry.objects.get(run=run, action="run.stop_requested")
    behind_the_triggers("UPDATE runs_ledgerentry SET reason = 'timeout' WHERE id = %s", [target.pk])
    broken = notify.ledger_check()
    assert broken is not None and broken.entry_id == target.pk
    notify.ledger_check()  # found again: not announced again
    [delivery] = Delivery.objects.filter(event="ledger.broken")
    assert delivery.channel_id == webhook.pk  # the run's team only
    assert delivery.message["link"].endswith("/audit/")
    assert "changed" in delivery.message["text"]
    assert notify.deliveries_send_due(limit=5, sender="t") == 1
    assert receiver.hits[0].verified


@pytest.mark.django_db(transaction=True)
def test_the_scheduled_walk_runs_beside_the_loop_one_at_a_time(team, monkeypatch):
    """The embedded loop's hourly walk must not hold its tick (dispatch, reapers, watchdog)."""
    release = threading.Event()
    real = ledger_checks.ledger_verify

    def slow_walk(**kwargs):
        assert release.wait(10)
        return real(**kwargs)

    monkeypatch.setattr(ledger_checks, "ledger_verify", slow_walk)
    started = time.monotonic()
    assert periodic.walk_ledger_aside() is True
    assert time.monotonic() - started < 1.0  # back to the loop at once
    assert periodic.walk_ledger_aside() is False  # the first is still walking
    release.set()
    wait_until(lambda: not periodic._walking.locked())  # the thread let go as it ended
    [walk] = LedgerVerification.objects.all()
    assert walk.requested_by == "scheduled" and walk.finished_at is not None
    assert walk.error == "" and walk.checked == LedgerEntry.objects.count()
