"""The leakage race on PostgreSQL: four dispatcher processes against a Stop at a random moment.

The seed's failure case is a dispatcher that scanned "ready to send" by the old state and sent
after the user pressed Stop. Every iteration here recreates it on purpose, on a fresh run with
20 pending outbox items:

1. four dispatcher processes scan the run's pending items — a snapshot the stop will make
   stale — and each item is in two dispatchers' snapshots, so they also race each other;
2. they all start dispatching their snapshot at once;
3. the test process stops the run at a random moment inside the dispatch window;
4. once the dispatchers are done, every item must be sent (claimed before the stop, at the
   pre-stop epoch) or frozen (never claimed).

Across all iterations: no frozen item ever reaches the receiver, every receipt is an item
claimed before its run's stop at the pre-stop epoch, and no idempotency key arrives twice.

The runs are made through the services by two extra "agent" processes while the race goes
on, so preparing 300 runs does not add to the test's wall time.
"""

from __future__ import annotations

import os
import random
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs import selectors, services
from runs.actors import Actor
from runs.models import OutboxItem, OutboxStatus
from tests.dispatch.race import RunSupply, race_round, tally

# 100 rounds land ~20 stops inside a dispatch window (the assertion below) in the suite's time;
# `make soak` runs 10,000 stops for the long version.
ITERATIONS = int(os.environ.get("SAFESTOP_RACE_ITERATIONS", 100))
ITEMS = 20
DISPATCHERS = 4
AGENTS = 2
BATCH = 10
REVIEWER = Actor.system("reviewer-race")


def _synchronous_commit(value: str) -> None:
    # Durability on a crash is not what this test is about, and an fsync per commit would
    # make it take minutes. Locking and visibility are unaffected. ALTER DATABASE applies to
    # every new session on the test database (the child processes); SET to this one.
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        if value == "default":
            cursor.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')
            cursor.execute("RESET synchronous_commit")
        else:
            cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = {value}')
            cursor.execute(f"SET synchronous_commit = {value}")


@pytest.fixture
def fast_commits(transactional_db):
    _synchronous_commit("off")
    yield
    _synchronous_commit("default")


def _stop(run_id: str) -> services.StopOutcome:
    return services.run_stop(run_id=run_id, reason="user_stop", actor=REVIEWER)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_item_is_ever_sent_after_the_stop_that_froze_it(
    team, receiver, spawn_dispatcher, fast_commits
) -> None:
    began, t0 = timezone.now(), time.perf_counter()
    dispatchers = [spawn_dispatcher() for _ in range(DISPATCHERS)]
    agents = [spawn_dispatcher() for _ in range(AGENTS)]
    supply = RunSupply(
        agents,
        team_slug=team.slug,
        url=receiver.url("/hook"),
        total=ITERATIONS + 1,
        items=ITEMS,
        batch=BATCH,
    )

    # A probe measures the dispatch window: 20 items, four dispatchers, nobody stopping them.
    probe = supply.next()
    probe_stops, window = race_round(dispatchers, [probe], None, items=ITEMS, stop=_stop)
    assert OutboxItem.objects.filter(run_id=probe, status=OutboxStatus.SENT).count() == ITEMS

    rng = random.Random(int(os.environ.get("SAFESTOP_RACE_SEED", time.time_ns())))
    stops: dict[str, object] = dict(probe_stops)
    for _iteration in range(ITERATIONS):
        run_id = supply.next()
        # Anywhere in the first 80% of the window: where claims and the stop can interleave.
        # (After the last claim the stop is trivially safe; the probe covers that case, and
        # every extra send costs CPU that two cores do not have to spare.)
        outcomes, elapsed = race_round(
            dispatchers, [run_id], [rng.uniform(0, window * 0.8)], items=ITEMS, stop=_stop
        )
        outcome = outcomes[run_id]
        assert isinstance(outcome, services.StopOutcome)
        assert outcome.created and outcome.stop_request is not None
        stops[run_id] = outcome
        if OutboxItem.objects.filter(run_id=run_id, status=OutboxStatus.SENT).count() == ITEMS:
            # Everything went out before the stop: the machine got faster (shared CI cores);
            # follow it, so stops keep landing among the claims.
            window = 0.7 * window + 0.3 * elapsed
    raced = time.perf_counter()

    # What the database says against what the receiver got (tests/dispatch/race.py).
    result = tally(stops, receiver.keys(), items=ITEMS)
    assert result.items == len(stops) * ITEMS
    assert not result.other, f"items neither sent nor frozen: {result.other}"
    assert result.duplicates == 0, result.examples
    assert result.leaks == 0, result.examples
    assert result.inconsistent == 0 and result.unknown_keys == 0, result.examples
    assert result.receipts == result.sent and result.sent_not_received == 0, (
        "every sent item was received once, and nothing else"
    )
    leakage = selectors.side_effect_leakage(
        since=began, until=timezone.now() + timedelta(seconds=1)
    )
    assert leakage["dispatches_after_stop"] == 0

    print(
        f"\nleakage race: iterations={len(stops) - 1} (+1 probe) dispatchers={DISPATCHERS} "
        f"items_per_run={ITEMS} {result.line()} last_window_ms={window * 1000:.0f} "
        f"elapsed_s={raced - t0:.1f}"
    )
    # The race was really run: stops landed between claims, and some while a send was in flight.
    assert len(stops) - 1 >= ITERATIONS
    assert result.runs_mixed >= ITERATIONS // 5, "stops rarely landed inside the dispatch window"
    assert result.sent > 0 and result.frozen > 0 and result.in_flight_at_stop > 0
