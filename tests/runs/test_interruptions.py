"""An interrupted run with unknowns needs a person, as a dirty stop does (DESIGN §2): the
interruption keeps what it left unknown, resume waits for each to be resolved, the interruption
packet lists them, and the stop-quality figure counts the interruptions that ended cleanly
(DESIGN §7)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from handoff.packets import interruption_packet
from handoff.services import resolution_record
from runs import services
from runs.actors import Actor
from runs.errors import IllegalTransition
from runs.models import OutboxStatus, Run, RunStatus
from runs.selectors import interruptions_recovered, needs_resolution_q, run_dirty_reasons
from tests.support.scenarios import interrupted, reload, running

pytestmark = pytest.mark.django_db

BOB = Actor("user", "2", "bob")


def _write_id(run: Run) -> str:
    return run.execution_records.get(side_effect="write").tool_call_id


def _resolve_all(run: Run) -> None:
    resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id=_write_id(run),
        decision="not_applied",
        evidence="not in the deploy history",
        actor=BOB,
    )
    for item in run.outbox_items.filter(status=OutboxStatus.DISPATCHING):
        resolution_record(
            run_id=run.pk,
            target="outbox",
            target_id=item.public_id,
            decision="applied",
            evidence="the mail server logged it",
            actor=BOB,
        )


def test_the_interruption_keeps_the_outbox_items_it_left_in_flight(team):
    run = interrupted(team, outbox_in_flight=True)
    item = run.outbox_items.get(status=OutboxStatus.DISPATCHING)
    assert run.interruption["outbox_in_flight"] == [item.public_id]
    assert run.interruption["calls_in_flight"] == [_write_id(run)]
    assert run_dirty_reasons(run) == ["unconfirmed_side_effects", "outbox_in_flight"]


def test_resume_is_refused_while_an_unknown_remains_and_says_which(team):
    run = interrupted(team, outbox_in_flight=True)
    with pytest.raises(IllegalTransition) as refused:
        services.run_resume(run_id=run.pk, actor=BOB)
    assert "resolve the interruption's unknowns" in str(refused.value)
    assert "unconfirmed side effects, outbox items in flight" in str(refused.value)
    resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id=_write_id(run),
        decision="not_applied",
        evidence="not in the deploy history",
        actor=BOB,
    )
    with pytest.raises(IllegalTransition, match="outbox items in flight"):
        services.run_resume(run_id=run.pk, actor=BOB)
    assert reload(run).status == RunStatus.INTERRUPTED


def test_once_every_unknown_is_resolved_the_run_resumes_at_a_new_epoch(team):
    run = interrupted(team, outbox_in_flight=True)
    _resolve_all(run)
    assert reload(run).status == RunStatus.INTERRUPTED  # resolving does not resume by itself
    resumed = services.run_resume(run_id=run.pk, actor=BOB)
    assert (resumed.status, resumed.stop_epoch) == (RunStatus.PENDING, 2)


def test_the_interruption_packet_lists_each_unknown_and_keeps_it_once_resolved(team):
    run = interrupted(team, outbox_in_flight=True)
    item = run.outbox_items.get(status=OutboxStatus.DISPATCHING)
    packet = interruption_packet(run)
    assert packet["kind"] == "interruption"
    assert packet["interruption"]["reason"] == "lease_expired"
    assert packet["interruption_reason"] == "lease_expired"
    assert packet["dirty_reasons"] == ["unconfirmed_side_effects", "outbox_in_flight"]
    (write,) = packet["unconfirmed_side_effects"]
    assert (write["tool_call_id"], write["execution_state"], write["side_effect_state"]) == (
        _write_id(run),
        "unknown",
        "pending_verification",
    )
    assert write["recovery_action"].startswith("query deploy-")
    assert packet["in_flight_outbox_ids"] == [item.public_id]
    assert {step["status"] for step in packet["pending_steps"]} == {"planned"}

    _resolve_all(run)
    after = interruption_packet(reload(run))
    assert after["dirty_reasons"] == []
    assert [entry["side_effect_state"] for entry in after["unconfirmed_side_effects"]] == [
        "not_applied"
    ]
    assert after["in_flight_outbox_ids"] == [item.public_id]  # listed, now sent


def test_an_interrupted_run_with_unknowns_needs_resolution_and_one_without_does_not(team):
    with_unknown = interrupted(team)
    without = interrupted(team, write_open=False)
    dirty_free_running, _ = running(team)
    needing = set(Run.objects.filter(needs_resolution_q()).values_list("pk", flat=True))
    assert with_unknown.pk in needing
    assert without.pk not in needing and dirty_free_running.pk not in needing
    _resolve_all(with_unknown)
    assert not Run.objects.filter(needs_resolution_q(), pk=with_unknown.pk).exists()


def _figure(team) -> dict:
    now = timezone.now()
    return interruptions_recovered(
        since=now - timedelta(hours=1), until=now + timedelta(hours=1), team_ids=[team.pk]
    )


def test_recovered_counts_an_interruption_resolved_and_resumed(team):
    run = interrupted(team)
    assert _figure(team) == {"interrupted": 1, "recovered_cleanly": 0, "rate": 0.0}
    _resolve_all(run)
    assert _figure(team)["recovered_cleanly"] == 0  # resolved, not yet resumed
    services.run_resume(run_id=run.pk, actor=BOB)
    assert _figure(team) == {"interrupted": 1, "recovered_cleanly": 1, "rate": 1.0}


def test_recovered_counts_a_clean_interruption_stopped_cleanly(team):
    run = interrupted(team, write_open=False)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=BOB)
    assert reload(run).status == RunStatus.STOPPED_CLEANLY
    assert _figure(team)["recovered_cleanly"] == 1


def test_an_interruption_stopped_dirty_is_not_recovered_even_once_resolved(team):
    run = interrupted(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=BOB)
    assert reload(run).status == RunStatus.STOPPED_DIRTY
    _resolve_all(run)
    assert reload(run).status == RunStatus.STOPPED_CLEANLY
    assert _figure(team)["recovered_cleanly"] == 0


def test_a_later_rounds_dirty_stop_does_not_undo_a_recovered_interruption(team):
    run = interrupted(team)
    _resolve_all(run)
    services.run_resume(run_id=run.pk, actor=BOB)
    lease = services.lease_acquire(run_id=run.pk, worker_id="w-2", ttl_seconds=30, actor=BOB)
    services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="second-write",
        tool="deploy.push",
        side_effect="write",
        actor=BOB,
    )
    services.run_stop(run_id=run.pk, reason="user_stop", actor=BOB)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=BOB)
    assert reload(run).status == RunStatus.STOPPED_DIRTY
    assert _figure(team)["recovered_cleanly"] == 1
