"""Outbox destinations are checked at enqueue: a malformed one is a 400 with a reason, never a
500 and never an item that ends `unknown` at send time."""

from __future__ import annotations

import pytest

from runs import services
from runs.errors import InvalidInput
from runs.models import OutboxItem
from tests.support.scenarios import AGENT, new_run, start

pytestmark = pytest.mark.django_db

MALFORMED_WEBHOOKS = [
    "http://hooks.test:99999/x",  # port out of range
    "http://hooks.test:port/x",  # port not a number
    "http://[::1/x",  # unclosed IPv6 bracket
    "http://[::1]]:80/x",
    "http://hooks.test:80:81/x",
    "http://hooks.test/x\r\nHost: evil",
    "http://hooks.test/x\x00",
    "https://",
    "ftp://hooks.test/x",
    "hooks.test:8080",  # a host glued to a port, no scheme
]

BAD_EMAILS = [
    "ops@example.com\r\nBcc: everyone@example.com",
    "ops@example.com\nBcc: x@example.com",
    "not-an-address",
    "a@b@c",
    "ops@example.com, other@example.com",
    "x" * 250 + "@example.com",
]


@pytest.mark.parametrize("destination", MALFORMED_WEBHOOKS)
def test_malformed_webhook_urls_are_refused_not_crashed_on(destination, settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.test", "hooks.test:8080", "[::1]"]
    with pytest.raises(InvalidInput) as refused:
        services.validate_outbox_destination("webhook", destination)
    assert refused.value.extra["field"] == "destination"


def test_a_webhook_on_the_allow_list_passes(settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.test:8080"]
    services.validate_outbox_destination("webhook", "http://hooks.test:8080/deploy?x=1")


@pytest.mark.parametrize("destination", BAD_EMAILS)
def test_bad_email_destinations_are_refused_at_enqueue_and_nothing_is_written(team, destination):
    run = new_run(team)
    start(run)
    run.refresh_from_db()
    with pytest.raises(InvalidInput, match="email destination"):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=run.stop_epoch,
            transport="email",
            destination=destination,
            payload={"subject": "hi"},
            idempotency_key="mail-1",
            actor=AGENT,
        )
    assert not OutboxItem.objects.exists()


def test_a_plain_address_is_accepted(team):
    run = new_run(team)
    start(run)
    run.refresh_from_db()
    item, created = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="email",
        destination="ops@example.com",
        payload={"subject": "hi"},
        idempotency_key="mail-1",
        actor=AGENT,
    )
    assert created and item.destination == "ops@example.com"
