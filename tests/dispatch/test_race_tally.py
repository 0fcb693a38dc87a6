"""The tally the leakage race and the soak judge by (tests/dispatch/race.py): it must see a leak,
a duplicate and a stranger's key, or a clean soak would prove nothing."""

from __future__ import annotations

import pytest

from runs import dispatch, services
from runs.actors import Actor
from runs.models import OutboxStatus
from tests.dispatch.race import share, tally
from tests.support.scenarios import make_running

AGENT = Actor.system("agent")


def _stopped_run_with_one_sent_item(team, receiver):
    run, _lease = make_running(team)
    items = [
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=run.stop_epoch,
            transport="webhook",
            destination=receiver.url("/hook"),
            payload={"seq": seq},
            idempotency_key=f"{run.pk}-{seq}",
            actor=AGENT,
        )[0]
        for seq in range(2)
    ]
    assert dispatch.dispatch_one(items[0].pk).status == OutboxStatus.SENT
    outcome = services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.system("rev"))
    return run, outcome, [item.idempotency_key for item in items]


@pytest.mark.django_db(transaction=True)
def test_a_clean_race_tallies_clean(team, receiver) -> None:
    run, outcome, (sent_key, frozen_key) = _stopped_run_with_one_sent_item(team, receiver)

    result = tally({run.pk: outcome}, receiver.keys(), items=2)

    assert receiver.keys() == [sent_key]
    assert (result.sent, result.frozen, result.receipts, result.runs_mixed) == (1, 1, 1, 1)
    assert result.clean and result.leaks == 0 and result.sent_not_received == 0


@pytest.mark.django_db(transaction=True)
def test_the_tally_sees_a_leak_a_duplicate_and_a_strangers_key(team, receiver) -> None:
    run, outcome, (sent_key, frozen_key) = _stopped_run_with_one_sent_item(team, receiver)

    result = tally({run.pk: outcome}, [sent_key, sent_key, frozen_key, "nobody-0"], items=2)

    assert result.frozen_received == 1 and result.leaks == 1
    assert result.duplicates == 1
    assert result.unknown_keys == 1
    assert not result.clean
    assert any(frozen_key in example for example in result.examples)


def test_every_item_has_exactly_two_contenders() -> None:
    for items, slots in ((20, 4), (4, 8), (20, 8), (3, 2)):
        assert sum(share(items, slot, slots) for slot in range(slots)) == 2 * items
