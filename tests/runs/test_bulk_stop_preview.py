"""A bulk stop's confirm acts on what was previewed, never on a wider set (DESIGN §12)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runs import selectors as run_selectors
from runs import services
from runs.actors import Actor
from runs.errors import NotFound, PreviewExpired
from runs.models import BulkStopPreview, BulkStopResult, Run, RunStatus
from runs.services import BulkFilter
from tests.support.scenarios import SYSTEM, make_run, make_running, reload

pytestmark = pytest.mark.django_db


def _preview(team, actor, **filter_fields):
    return services.bulk_stop_preview(
        team_ids=[team.pk], filter=BulkFilter(**filter_fields), actor=actor
    )


def test_a_confirm_stops_exactly_the_previewed_runs_and_counts_the_newcomers(team, reviewer_actor):
    shown = [make_running(team)[0] for _ in range(4)]
    preview = _preview(team, reviewer_actor, status="running")
    assert preview.preview_id.startswith("bprev_")
    assert sorted(preview.run_ids) == sorted(run.pk for run in shown)
    assert preview.will_stop == 4
    newcomers = [make_running(team)[0] for _ in range(3)]  # began to match after the preview

    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(),
        reason="user_stop",
        preview_id=preview.preview_id,
    )

    assert answer.bulk.counts == {"stopped": 4}
    assert answer.bulk.new_since_preview == 3
    assert answer.bulk.preview_id == preview.preview_id
    assert answer.bulk.filter == {"status": "running"}
    assert {result.run_id for result in answer.results} == {run.pk for run in shown}
    assert {reload(run).status for run in shown} == {RunStatus.CANCEL_REQUESTED}
    assert {reload(run).status for run in newcomers} == {RunStatus.RUNNING}


def test_a_previewed_run_that_finished_meanwhile_is_answered_not_stopped(team, reviewer_actor):
    first, lease = make_running(team)
    second, _ = make_running(team)
    preview = _preview(team, reviewer_actor, agent="report-bot")
    services.events_ingest(
        run_id=first.pk,
        epoch=lease.epoch,
        events=[{"event_id": "done", "type": "run.completed"}],
        actor=SYSTEM,
    )
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(),
        reason="user_stop",
        preview_id=preview.preview_id,
    )
    outcomes = {result.run_id: result.outcome for result in answer.results}
    assert outcomes == {first.pk: "already_finished", second.pk: "stopped"}
    assert answer.bulk.new_since_preview == 0


def test_a_preview_counts_only_runs_a_stop_would_change(team, reviewer_actor):
    running, _ = make_running(team)
    stopping, _ = make_running(team)
    services.run_stop(run_id=stopping.pk, reason="user_stop", actor=SYSTEM)
    preview = _preview(team, reviewer_actor, agent="report-bot")
    assert preview.run_ids == [running.pk]
    assert preview.will_stop == 1
    assert preview.already_stopping == 1


def test_a_preview_without_an_actor_records_nothing(team):
    make_running(team)
    preview = services.bulk_stop_preview(team_ids=[team.pk], filter=BulkFilter(agent="report-bot"))
    assert preview.preview_id == "" and preview.run_ids == []
    assert not BulkStopPreview.objects.exists()


def test_another_callers_preview_is_not_found(team, reviewer_actor):
    make_running(team)
    preview = _preview(team, reviewer_actor, agent="report-bot")
    someone_else = Actor.system("someone-else")
    with pytest.raises(NotFound):
        services.bulk_stop(
            actor=someone_else,
            team_ids=[team.pk],
            filter=BulkFilter(),
            reason="user_stop",
            preview_id=preview.preview_id,
        )
    assert not BulkStopResult.objects.exists()


def test_a_stale_preview_is_refused(team, reviewer_actor, settings):
    run, _ = make_running(team)
    preview = _preview(team, reviewer_actor, agent="report-bot")
    settings.SAFESTOP_BULK_PREVIEW_SECONDS = 60
    BulkStopPreview.objects.filter(preview_id=preview.preview_id).update(
        created_at=BulkStopPreview.objects.get().created_at - timedelta(seconds=61)
    )
    with pytest.raises(PreviewExpired):
        services.bulk_stop(
            actor=reviewer_actor,
            team_ids=[team.pk],
            filter=BulkFilter(),
            reason="user_stop",
            preview_id=preview.preview_id,
        )
    assert reload(run).status == RunStatus.RUNNING


def test_without_a_preview_the_confirm_takes_the_filters_set_now(team, reviewer_actor):
    runs = [make_running(team)[0] for _ in range(2)]
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(status="running"),
        reason="user_stop",
    )
    assert answer.bulk.preview_id == "" and answer.bulk.new_since_preview == 0
    assert {result.run_id for result in answer.results} == {run.pk for run in runs}


def test_a_result_says_requested_until_the_run_really_ends(team, reviewer_actor):
    draining, lease = make_running(team)
    idle = make_run(team)  # no worker: settles inside its own stop
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(agent="report-bot"),
        reason="user_stop",
    )
    states = {
        result.run_id: run_selectors.bulk_result_state(result.outcome, reload_status(result.run_id))
        for result in answer.results
    }
    assert states == {draining.pk: "requested", idle.pk: RunStatus.STOPPED_CLEANLY}
    services.run_drained(
        run_id=draining.pk, lease_token=lease.token, epoch=lease.epoch, actor=SYSTEM
    )
    assert run_selectors.bulk_result_state("stopped", reload(draining).status) == "stopped_cleanly"
    assert run_selectors.bulk_result_state("stopped", RunStatus.STOPPED_DIRTY) == "stopped_dirty"
    assert (
        run_selectors.bulk_result_state("already_finished", RunStatus.COMPLETED)
        == "already_finished"
    )


def reload_status(run_id: str) -> str:
    return Run.objects.get(pk=run_id).status
