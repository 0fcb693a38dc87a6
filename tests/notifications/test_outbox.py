"""The notifications' own transactional outbox (DESIGN §11): rows written with the event, one
per subscribed channel, deduplicated, sent after commit with retries and backoff."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from notifications import services as notify
from notifications.models import Delivery, DeliveryStatus
from notifications.transports import Answer, new_webhook_secret
from runs import services
from runs.actors import Actor
from runs.ledger import ledger_append
from runs.models import LedgerEntry, Run
from tests.support.scenarios import AGENT, new_run, start, stopped_dirty

pytestmark = pytest.mark.django_db


def _send_all() -> int:
    return notify.deliveries_send_due(limit=100, sender="test-sender")


def _make_due() -> None:
    Delivery.objects.filter(status=DeliveryStatus.PENDING).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )


def _held_call(run: Run, call_id: str = "charge_1") -> None:
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id=call_id,
        tool="payments.charge",
        side_effect="write",
        arguments={"amount": 120},
        actor=AGENT,
        needs_approval=True,
    )


# --------------------------------------------------------------------------------------------
# written with the event


def test_an_action_nobody_needs_to_hear_about_costs_no_query(team, webhook):
    run = new_run(team)
    entry = LedgerEntry(run=run, action="lease.acquired", payload={})
    with CaptureQueriesContext(connection) as queries:
        notify.deliveries_enqueue_for_entry(entry, run)
    assert len(queries) == 0


def test_a_dirty_stop_writes_one_delivery_per_subscribed_channel(
    team, other_team, receiver, make_channel
):
    wanted, _ = make_channel(team, receiver.url("/a"), name="all events")
    filtered, _ = make_channel(team, receiver.url("/b"), name="report bots", agent_glob="report-*")
    make_channel(team, receiver.url("/c"), name="approvals only", events=["approval.waiting"])
    make_channel(team, receiver.url("/d"), name="other bots", agent_glob="billing-*")
    make_channel(other_team, receiver.url("/e"), name="other team")
    disabled, _ = make_channel(team, receiver.url("/f"), name="off")
    disabled.enabled = False
    disabled.save()

    run = stopped_dirty(team, agent="report-bot")

    deliveries = Delivery.objects.filter(run=run)
    assert sorted(d.channel_id for d in deliveries) == sorted([wanted.pk, filtered.pk])
    assert {d.event for d in deliveries} == {"run.stopped_dirty"}
    message = deliveries[0].message
    assert message["link"] == f"http://127.0.0.1:8000/runs/{run.pk}/packet/"
    assert "unconfirmed side effects" in message["text"]
    assert receiver.hits == []  # written, not sent: nothing left the building yet


def test_the_delivery_rolls_back_with_its_event(team, webhook):
    run = new_run(team)
    with pytest.raises(RuntimeError), transaction.atomic():
        ledger_append(
            run=run,
            actor=Actor.system("test"),
            action="run.stopped_dirty",
            payload={"dirty_reasons": ["outbox_in_flight"], "stop_request_id": 1},
        )
        assert Delivery.objects.count() == 1
        raise RuntimeError("the transition failed after its ledger entry")
    assert Delivery.objects.count() == 0


def test_a_repeated_event_writes_no_second_delivery(team, webhook):
    run = stopped_dirty(team)
    entry = LedgerEntry.objects.get(run=run, action="run.stopped_dirty")
    notify.deliveries_enqueue_for_entry(entry, run)
    notify.deliveries_enqueue_for_entry(entry, run)
    assert Delivery.objects.filter(run=run).count() == 1


def test_a_broken_listener_never_fails_the_event(team, webhook, monkeypatch, caplog):
    def broken(notice):
        Delivery.objects.create(team_id=-1, event="x", event_key="x", next_attempt_at=None)

    monkeypatch.setattr(notify, "deliveries_enqueue", broken)
    run = stopped_dirty(team)
    assert run.status == "stopped_dirty"
    assert LedgerEntry.objects.filter(run=run, action="run.stopped_dirty").exists()
    assert Delivery.objects.count() == 0
    assert "not queued" in caplog.text


def test_events_map_to_what_a_person_must_do(team, make_channel, receiver):
    make_channel(team, receiver.url())
    run = new_run(team, agent="billing-bot")
    start(run)
    run.refresh_from_db()
    _held_call(run)
    [waiting] = Delivery.objects.filter(event="approval.waiting")
    approval = run.approvals.get()
    assert waiting.event_key == f"approval.waiting:{approval.public_id}"
    assert waiting.message["link"].endswith(f"/approvals/{approval.public_id}/")
    assert waiting.message["facts"][0] == ["Waiting for", "payments.charge"]
    later = approval.deadline + timedelta(seconds=1)
    assert services.approval_expire(approval_id=approval.pk, now=later)
    assert Delivery.objects.filter(event="approval.expired").count() == 1


def test_an_interruption_notifies_only_with_unconfirmed_writes(team, webhook):
    from tests.support.scenarios import run_interrupt

    quiet = new_run(team)
    start(quiet)
    run_interrupt(run_id=quiet.pk)
    assert not Delivery.objects.filter(run=quiet).exists()

    reading = new_run(team)
    read_lease = start(reading)
    services.permit_request(
        run_id=reading.pk,
        epoch=read_lease.epoch,
        tool_call_id="search_1",
        tool="web.search",
        side_effect="none",
        actor=AGENT,
    )
    run_interrupt(run_id=reading.pk)
    assert not Delivery.objects.filter(run=reading).exists()  # a lost read needs nobody

    busy = new_run(team)
    lease = start(busy)
    services.permit_request(
        run_id=busy.pk,
        epoch=lease.epoch,
        tool_call_id="deploy_1",
        tool="deploy.push",
        side_effect="write",
        actor=AGENT,
    )
    run_interrupt(run_id=busy.pk)
    [delivery] = Delivery.objects.filter(run=busy)
    assert delivery.event == "run.interrupted" and "deploy_1" in json.dumps(delivery.message)


# --------------------------------------------------------------------------------------------
# sent after commit


def test_a_webhook_is_signed_and_verified_by_the_standard_verifier(team, webhook, receiver):
    run = stopped_dirty(team)
    assert _send_all() == 1
    [hit] = receiver.hits
    assert hit.verified, hit.verify_error
    delivery = Delivery.objects.get(run=run)
    assert hit.headers["webhook-id"] == delivery.public_id
    body = json.loads(hit.body)
    assert body["type"] == "run.stopped_dirty" and body["data"]["run_id"] == run.pk
    assert delivery.status == DeliveryStatus.SENT
    assert (delivery.response_status, delivery.response_excerpt) == (200, "ok")


def test_a_wrong_secret_does_not_verify(team, webhook, receiver):
    receiver.secret = new_webhook_secret()
    stopped_dirty(team)
    _send_all()
    assert receiver.hits and not receiver.hits[0].verified


def test_a_500_is_retried_with_exponential_backoff_then_sent(team, webhook, receiver, settings):
    settings.SAFESTOP_NOTIFY_RETRY_BASE_SECONDS = 10
    receiver.answers = [(500, "upstream down"), (503, "still down")]
    run = stopped_dirty(team)
    before = timezone.now()
    assert _send_all() == 0
    delivery = Delivery.objects.get(run=run)
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("pending", 1, 500)
    assert delivery.response_excerpt == "upstream down"
    first_wait = (delivery.next_attempt_at - before).total_seconds()
    assert 9 <= first_wait <= 12
    assert _send_all() == 0  # not due yet: nothing is sent early
    assert len(receiver.hits) == 1
    _make_due()
    before = timezone.now()
    _send_all()
    delivery.refresh_from_db()
    assert delivery.attempts == 2
    assert 19 <= (delivery.next_attempt_at - before).total_seconds() <= 22  # doubled
    _make_due()
    assert _send_all() == 1
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("sent", 3)
    assert len(set(receiver.ids())) == 1  # every attempt carries the same webhook-id


def test_out_of_attempts_the_delivery_fails_with_the_answer(team, webhook, receiver, settings):
    settings.SAFESTOP_NOTIFY_MAX_ATTEMPTS = 2
    receiver.answers = [(502, "bad gateway")] * 2
    run = stopped_dirty(team)
    _send_all()
    _make_due()
    _send_all()
    delivery = Delivery.objects.get(run=run)
    assert (delivery.status, delivery.attempts) == ("failed", 2)
    assert (delivery.response_status, delivery.response_excerpt) == (502, "bad gateway")


@pytest.mark.parametrize("status", [400, 404, 302])
def test_a_refusal_or_a_redirect_fails_at_once(team, webhook, receiver, status):
    receiver.answers = [(status, "nope")]
    run = stopped_dirty(team)
    _send_all()
    delivery = Delivery.objects.get(run=run)
    assert (delivery.status, delivery.response_status) == ("failed", status)
    assert len(receiver.hits) == 1  # a redirect is never followed


def test_a_target_taken_off_the_allow_list_is_never_contacted(team, webhook, receiver, settings):
    run = stopped_dirty(team)
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = []
    _send_all()
    delivery = Delivery.objects.get(run=run)
    assert delivery.status == "failed" and "SAFESTOP_WEBHOOK_ALLOWED_HOSTS" in delivery.last_error
    assert receiver.hits == []


def test_a_hanging_target_times_out_and_is_retried_later(team, webhook, receiver):
    receiver.hang = True
    run = stopped_dirty(team)
    _send_all()
    delivery = Delivery.objects.get(run=run)
    assert delivery.status == "pending" and delivery.attempts == 1
    assert "ReadTimeout" in delivery.last_error


def test_a_stop_never_contacts_a_black_hole_target(team, black_hole, make_channel):
    make_channel(team, f"http://{black_hole.host}/hook")
    run = stopped_dirty(team)
    assert black_hole.connections == []  # the stop and its transaction only wrote a row
    assert Delivery.objects.get(run=run).status == "pending"
    _send_all()  # the sender, later and elsewhere, is the one that waits on it
    assert len(black_hole.connections) == 1
    delivery = Delivery.objects.get(run=run)
    assert delivery.status == "pending" and "ReadTimeout" in delivery.last_error


def test_a_sender_that_died_mid_send_leaves_the_delivery_to_the_reaper(team, webhook, receiver):
    run = stopped_dirty(team)
    [claimed] = notify.deliveries_claim_due(limit=10, claimer="dead-sender")
    assert notify.deliveries_claim_due(limit=10, claimer="other") == []
    assert notify.deliveries_reap_stuck(older_than_seconds=3600) == 0
    assert notify.deliveries_reap_stuck(older_than_seconds=-1) == 1
    assert _send_all() == 1
    # The dead sender's late answer changes nothing.
    assert (
        notify.delivery_record(delivery_id=claimed, claimer="dead-sender", answer=Answer(False))
        == ""
    )
    assert Delivery.objects.get(run=run).status == "sent"


def test_the_background_tick_sends_due_deliveries(team, webhook, receiver):
    from runs import dispatch

    stopped_dirty(team)
    report = dispatch.run_periodic_work(dispatch_limit=0)
    assert report.registered["notifications"] == 1
    assert len(receiver.hits) == 1


def test_secrets_never_reach_the_logs(team, receiver, make_channel, caplog):
    caplog.set_level(logging.DEBUG)
    channel, secret = make_channel(team, receiver.url())
    receiver.answers = [(500, "boom")]
    stopped_dirty(team)
    _send_all()
    assert secret and secret not in caplog.text
    entry = LedgerEntry.objects.get(action="notification_channel.created")
    assert secret not in json.dumps(entry.payload)
