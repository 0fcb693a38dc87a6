"""Assigning a handoff races accepting it, with real threads on PostgreSQL: both lock the run,
then the handoff (the one lock order), so whichever commits last decides, and the ledger says
which."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from handoff.models import Handoff, HandoffStatus
from handoff.services import handoff_accept, handoff_assign
from runs.actors import Actor
from runs.models import LedgerEntry
from tests.support.scenarios import handed_off

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ITERATIONS = 25


def _race(pool: ThreadPoolExecutor, *calls: Callable[[], Any]) -> list[Any]:
    barrier = threading.Barrier(len(calls))

    def start(call: Callable[[], Any]) -> Any:
        barrier.wait()
        if random.random() < 0.5:
            threading.Event().wait(random.random() / 2000)  # jitter so both orders happen
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - asserted below
            return error
        finally:
            connection.close()

    futures = [pool.submit(start, call) for call in calls]
    return [future.result(timeout=30) for future in futures]


def test_accept_racing_assign_ends_as_the_last_ledger_entry_says(team, alice, bob):
    orders = set()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for _ in range(ITERATIONS):
            handoff = Handoff.objects.get(run=handed_off(team, by=Actor.for_user(alice)))
            handoff_assign(handoff_id=handoff.pk, assignee=None, actor=Actor.for_user(alice))
            results = _race(
                pool,
                # Bob confirmed taking it (the console asks first when it is assigned to
                # someone else): the race is between his accept and the assignment.
                lambda h=handoff: handoff_accept(
                    handoff_id=h.pk, user=bob, actor=Actor.for_user(bob), take_from_assignee=True
                ),
                lambda h=handoff: handoff_assign(
                    handoff_id=h.pk, assignee=alice, actor=Actor.for_user(alice)
                ),
            )
            assert not [r for r in results if isinstance(r, Exception)], results
            handoff.refresh_from_db()
            actions = list(
                LedgerEntry.objects.filter(
                    run_id=handoff.run_id, action__in=("handoff.accepted", "handoff.assigned")
                )
                .order_by("run_seq")
                .values_list("action", flat=True)
            )
            assert actions[0] == "handoff.assigned"  # the unassign before the race
            raced = actions[1:]
            assert sorted(raced) == ["handoff.accepted", "handoff.assigned"], actions
            orders.add(tuple(raced))
            if raced[-1] == "handoff.accepted":  # assigned to alice, then bob took it
                assert (handoff.status, handoff.assignee_id) == (HandoffStatus.ACCEPTED, bob.pk)
            else:  # bob accepted, then it was given to alice: open again, for her to accept
                assert (handoff.status, handoff.assignee_id) == (HandoffStatus.OPEN, alice.pk)
                assert handoff.accepted_at is None
    assert orders  # at least one order ran (usually both)
