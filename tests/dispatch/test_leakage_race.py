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
from collections import deque
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs import selectors, services
from runs.actors import Actor
from runs.models import OutboxItem, OutboxStatus

ITERATIONS = int(os.environ.get("SAFESTOP_RACE_ITERATIONS", 300))
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


class RunSupply:
    """Runs prepared by agent processes, handed out as they become ready."""

    def __init__(self, agents, *, team_slug: str, url: str, total: int) -> None:
        self.agents, self.team_slug, self.url = agents, team_slug, url
        self.ready: deque[str] = deque()
        self.to_order = total
        self.busy: set[int] = set()
        for index in range(len(agents)):
            self._order(index)

    def _order(self, index: int) -> None:
        count = min(BATCH, self.to_order)
        if count <= 0:
            return
        self.to_order -= count
        self.agents[index].send(f"prep {self.team_slug} {count} {ITEMS} {self.url}")
        self.busy.add(index)

    def _collect(self, index: int, answer: str) -> None:
        self.ready.extend(answer.split(" ", 1)[1].split(","))
        self.busy.discard(index)
        self._order(index)

    def next(self) -> str:
        for index in list(self.busy):
            answer = self.agents[index].poll()
            if answer is not None:
                self._collect(index, answer)
        while not self.ready:
            index = next(iter(self.busy))
            self._collect(index, self.agents[index].read(timeout=120))
        return self.ready.popleft()


def _race_one(dispatchers, run_id: str, delay: float | None) -> tuple[services.StopOutcome, float]:
    """Scan, go, and stop after `delay` seconds (None: only once every dispatcher is done)."""
    for slot, proc in enumerate(dispatchers):
        proc.send(f"scan {run_id} {slot} {len(dispatchers)}")
    for proc in dispatchers:
        assert proc.read() == f"ready {ITEMS * 2 // len(dispatchers)}"
    started = time.perf_counter()
    for proc in dispatchers:
        proc.send("go")
    if delay is not None:
        time.sleep(delay)
        outcome = services.run_stop(run_id=run_id, reason="user_stop", actor=REVIEWER)
    for proc in dispatchers:
        assert proc.read().startswith("done ")
    elapsed = time.perf_counter() - started
    if delay is None:
        outcome = services.run_stop(run_id=run_id, reason="user_stop", actor=REVIEWER)
    return outcome, elapsed


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_no_item_is_ever_sent_after_the_stop_that_froze_it(
    team, receiver, spawn_dispatcher, fast_commits
) -> None:
    began, t0 = timezone.now(), time.perf_counter()
    dispatchers = [spawn_dispatcher() for _ in range(DISPATCHERS)]
    agents = [spawn_dispatcher() for _ in range(AGENTS)]
    supply = RunSupply(agents, team_slug=team.slug, url=receiver.url("/hook"), total=ITERATIONS + 1)

    # A probe measures the dispatch window: 20 items, four dispatchers, nobody stopping them.
    probe = supply.next()
    probe_stop, window = _race_one(dispatchers, probe, delay=None)
    assert OutboxItem.objects.filter(run_id=probe, status=OutboxStatus.SENT).count() == ITEMS

    rng = random.Random(int(os.environ.get("SAFESTOP_RACE_SEED", time.time_ns())))
    stops: dict[str, services.StopOutcome] = {probe: probe_stop}
    for _iteration in range(ITERATIONS):
        run_id = supply.next()
        # Anywhere in the first 80% of the window: where claims and the stop can interleave.
        # (After the last claim the stop is trivially safe; the probe covers that case, and
        # every extra send costs CPU that two cores do not have to spare.)
        outcome, elapsed = _race_one(dispatchers, run_id, delay=rng.uniform(0, window * 0.8))
        assert outcome.created and outcome.stop_request is not None
        stops[run_id] = outcome
        if OutboxItem.objects.filter(run_id=run_id, status=OutboxStatus.SENT).count() == ITEMS:
            # Everything went out before the stop: the machine got faster (shared CI cores);
            # follow it, so stops keep landing among the claims.
            window = 0.7 * window + 0.3 * elapsed
    raced = time.perf_counter()

    # ---- what the database says ------------------------------------------------------------
    items = {
        row["idempotency_key"]: row
        for row in OutboxItem.objects.filter(run_id__in=list(stops)).values(
            "idempotency_key",
            "run_id",
            "status",
            "claimed_at",
            "claim_epoch",
            "frozen_at",
            "frozen_by_epoch",
            "sent_at",
        )
    }
    assert len(items) == len(stops) * ITEMS
    by_run: dict[str, list[dict]] = {}
    for row in items.values():
        by_run.setdefault(row["run_id"], []).append(row)
    sent = frozen = in_flight_at_stop = mixed = all_frozen = all_sent = 0
    for run_id, outcome in stops.items():
        stop = outcome.stop_request
        rows = by_run[run_id]
        assert {row["status"] for row in rows} <= {OutboxStatus.SENT, OutboxStatus.FROZEN}, run_id
        for row in rows:
            if row["status"] == OutboxStatus.SENT:
                sent += 1
                assert row["claimed_at"] < stop.requested_at, (run_id, row)
                assert row["claim_epoch"] == stop.epoch_before, (run_id, row)
                assert row["frozen_at"] is None
                in_flight_at_stop += row["sent_at"] > stop.requested_at
            else:
                frozen += 1
                assert row["claimed_at"] is None, (run_id, row)
                assert row["frozen_by_epoch"] == stop.epoch_after
        run_sent = sum(row["status"] == OutboxStatus.SENT for row in rows)
        mixed += 0 < run_sent < ITEMS
        all_frozen += run_sent == 0
        all_sent += run_sent == ITEMS

    # ---- what the receiver got -------------------------------------------------------------
    receipts = receiver.keys()
    assert receiver.duplicates() == {}, "an idempotency key was received twice"
    for key in receipts:
        row = items[key]
        stop = stops[row["run_id"]].stop_request
        assert row["status"] != OutboxStatus.FROZEN and row["frozen_at"] is None, (
            f"frozen item {key} was received"
        )
        assert row["claimed_at"] < stop.requested_at, f"{key} was claimed after its run's stop"
        assert row["claim_epoch"] == stop.epoch_before, (
            f"{key} was claimed at epoch {row['claim_epoch']}"
        )
    assert len(receipts) == sent, "every sent item was received once, and nothing else"
    leakage = selectors.side_effect_leakage(
        since=began, until=timezone.now() + timedelta(seconds=1)
    )
    assert leakage["dispatches_after_stop"] == 0

    print(
        f"\nleakage race: iterations={len(stops) - 1} (+1 probe) dispatchers={DISPATCHERS} items_per_run={ITEMS} "
        f"items_sent={sent} items_frozen={frozen} receipts={len(receipts)} in_flight_at_stop={in_flight_at_stop} "
        f"duplicate_keys=0 frozen_received=0 claimed_after_stop=0 runs_mixed={mixed} "
        f"runs_all_frozen={all_frozen} runs_all_sent={all_sent} last_window_ms={window * 1000:.0f} "
        f"elapsed_s={raced - t0:.1f}"
    )
    # The race was really run: stops landed between claims, and some while a send was in flight.
    assert len(stops) - 1 >= ITERATIONS
    assert mixed >= ITERATIONS // 5, "stops rarely landed inside the dispatch window"
    assert sent > 0 and frozen > 0 and in_flight_at_stop > 0
