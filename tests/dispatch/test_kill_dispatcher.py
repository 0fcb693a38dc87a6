"""`kill -9` of a dispatcher process between claim and outcome (DESIGN §6)."""

from __future__ import annotations

import time

import pytest

from handoff.models import StopPacket
from runs import dispatch, services
from runs.actors import Actor
from runs.models import OutboxItem, OutboxStatus, RunStatus
from tests.support.scenarios import make_running, reload

AGENT = Actor.system("agent")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_killed_mid_send_leaves_dispatching_then_unknown_and_never_resends(
    team,
    receiver,
    spawn_dispatcher,
    settings,
) -> None:
    settings.SAFESTOP_DISPATCH_DEADLINE_SECONDS = 1.0
    run, lease = make_running(team)
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="webhook",
        destination=receiver.url("/block"),
        payload={"deploy": 77},
        idempotency_key="deploy-77",
        actor=AGENT,
    )
    victim = spawn_dispatcher()

    # 1. The other process claims the item and is mid-send: the receiver has the request and
    #    is holding the answer back.
    victim.send(f"dispatch {item.pk}")
    assert receiver.wait_for(1, timeout=20), victim.log()
    item.refresh_from_db()
    assert item.status == OutboxStatus.DISPATCHING
    assert item.claimed_by == f"proc-{victim.pid}"

    # 2. SIGKILL: no outcome will ever be recorded by that process.
    victim.kill()
    assert victim.proc.returncode == -9
    receiver.release()
    item.refresh_from_db()
    assert item.status == OutboxStatus.DISPATCHING

    # 3. Before the deadline the reaper leaves it alone; nothing re-sends it meanwhile.
    assert dispatch.reap_stuck_dispatches() == 0
    assert dispatch.dispatch_pending() == 0
    assert dispatch.dispatch_one(item) is None
    time.sleep(1.1)

    # 4. After it, the reaper says what we know: nothing. `unknown`, never re-sent.
    assert dispatch.reap_stuck_dispatches() == 1
    item.refresh_from_db()
    assert item.status == OutboxStatus.UNKNOWN
    assert f"proc-{victim.pid}" in item.last_error
    for _tick in range(3):
        report = dispatch.run_periodic_work()
        assert report.dispatched == 0 and report.errors == []
    survivor = spawn_dispatcher()
    assert survivor.ask(f"dispatch {item.pk}") == "dispatched none"
    assert survivor.ask("pending 10") == "pending 0"
    assert receiver.count("deploy-77") == 1
    assert OutboxItem.objects.get(pk=item.pk).status == OutboxStatus.UNKNOWN

    # 5. The stop that follows is dirty and says which item nobody knows about.
    services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.system("reviewer"))
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run = reload(run)
    assert run.status == RunStatus.STOPPED_DIRTY
    packet = StopPacket.objects.get(run=run, stop_epoch=run.stop_epoch).snapshot
    assert packet["in_flight_outbox_ids"] == [item.public_id]
