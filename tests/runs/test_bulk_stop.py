"""Bulk stop (DESIGN §12): a preview, then one stop per run through `run_stop`, tied by bulk_id."""

from __future__ import annotations

import pytest

from runs import services
from runs.errors import BulkTooLarge, InvalidInput
from runs.models import (
    BulkStop,
    BulkStopOutcome,
    BulkStopResult,
    LedgerEntry,
    RunStatus,
    StopRequest,
)
from runs.services import BulkFilter
from tests.support.scenarios import SYSTEM, make_run, make_running, reload

pytestmark = pytest.mark.django_db


def _complete(run) -> None:
    lease = services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=30, actor=SYSTEM)
    services.events_ingest(
        run_id=run.pk,
        epoch=lease.epoch,
        events=[{"event_id": "done", "type": "run.completed"}],
        actor=SYSTEM,
    )


def test_each_run_gets_its_own_stop_request_and_ledger_entry_with_the_bulk_id(team, reviewer_actor):
    running = [make_running(team)[0] for _ in range(3)]
    pending = make_run(team)
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(agent="report-bot"),
        reason="user_stop",
        note="agent gone wrong",
    )
    assert answer.created
    bulk = answer.bulk
    assert bulk.bulk_id.startswith("bulk_")
    assert (bulk.requested_by, bulk.reason, bulk.filter) == (
        "bob",
        "user_stop",
        {"agent": "report-bot"},
    )
    assert bulk.counts == {"stopped": 4}
    assert bulk.finished_at is not None
    results = {result.run_id: result for result in BulkStopResult.objects.filter(bulk=bulk)}
    assert set(results) == {run.pk for run in [*running, pending]}
    for run in [*running, pending]:
        result = results[run.pk]
        stop_request = StopRequest.objects.get(run=run)
        assert result.outcome == BulkStopOutcome.STOPPED
        assert result.stop_request_id == stop_request.pk
        assert result.stop_epoch == reload(run).stop_epoch == 2
        assert stop_request.note == "agent gone wrong"
        entry = LedgerEntry.objects.get(run=run, action="run.stop_requested")
        assert entry.payload["bulk_id"] == bulk.bulk_id
        assert entry.payload["stop_request_id"] == stop_request.pk
    # The running ones wait for their workers; the pending one (no lease) settled at once.
    assert {reload(run).status for run in running} == {RunStatus.CANCEL_REQUESTED}
    assert reload(pending).status == RunStatus.STOPPED_CLEANLY


def test_runs_already_stopping_or_finished_are_answered_and_not_stopped_again(team, reviewer_actor):
    stopping, _ = make_running(team)
    services.run_stop(run_id=stopping.pk, reason="user_stop", actor=SYSTEM)
    finished = make_run(team)
    _complete(finished)
    live, _ = make_running(team)
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(ids=(stopping.pk, finished.pk, live.pk, "run_nosuchrun0")),
        reason="user_stop",
    )
    outcomes = {result.run_id: result.outcome for result in answer.results}
    assert outcomes == {
        stopping.pk: BulkStopOutcome.ALREADY_STOPPING,
        finished.pk: BulkStopOutcome.ALREADY_FINISHED,
        live.pk: BulkStopOutcome.STOPPED,
        "run_nosuchrun0": BulkStopOutcome.NOT_FOUND,
    }
    assert StopRequest.objects.filter(run=stopping).count() == 1
    assert not StopRequest.objects.filter(run=finished).exists()


def test_a_filter_leaves_finished_runs_it_did_not_name_alone(team, reviewer_actor):
    finished = make_run(team)
    _complete(finished)
    live, _ = make_running(team)
    answer = services.bulk_stop(
        actor=reviewer_actor, team_ids=[team.pk], filter=BulkFilter(team="acme"), reason="user_stop"
    )
    assert [result.run_id for result in answer.results] == [live.pk]
    assert not LedgerEntry.objects.filter(run=finished, action="stop.ignored").exists()


def test_runs_of_other_teams_are_never_touched(team, other_team, reviewer_actor):
    ours, _ = make_running(team)
    theirs, _ = make_running(other_team)
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(ids=(ours.pk, theirs.pk)),
        reason="user_stop",
    )
    outcomes = {result.run_id: result.outcome for result in answer.results}
    # Another team's run is "not found", exactly like one that does not exist.
    assert outcomes == {ours.pk: "stopped", theirs.pk: "not_found"}
    assert reload(theirs).status == RunStatus.RUNNING


def test_runs_of_a_refused_team_are_not_allowed(team, other_team, reviewer_actor):
    ours, _ = make_running(team)
    theirs, _ = make_running(other_team)
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk, other_team.pk],
        filter=BulkFilter(status="running"),
        reason="user_stop",
        refusals={other_team.pk: "your role may not stop runs"},
    )
    by_run = {result.run_id: result for result in answer.results}
    assert by_run[ours.pk].outcome == "stopped"
    assert by_run[theirs.pk].outcome == "not_allowed"
    assert by_run[theirs.pk].detail == "your role may not stop runs"
    assert reload(theirs).status == RunStatus.RUNNING


def test_tool_filter_selects_runs_with_an_execution_record_of_that_tool(team, reviewer_actor):
    with_tool, lease = make_running(team)
    services.permit_request(
        run_id=with_tool.pk,
        epoch=lease.epoch,
        tool_call_id="c1",
        tool="deploy.push",
        side_effect="write",
        actor=SYSTEM,
    )
    without, _ = make_running(team)
    preview = services.bulk_stop_preview(team_ids=[team.pk], filter=BulkFilter(tool="deploy.push"))
    assert (preview.matching, preview.will_stop) == (1, 1)
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(tool="deploy.push"),
        reason="user_stop",
    )
    assert [result.run_id for result in answer.results] == [with_tool.pk]
    assert reload(without).status == RunStatus.RUNNING


def test_preview_counts_runs_by_state_and_writes_nothing(team, reviewer_actor):
    make_running(team)
    make_running(team)
    stopping, _ = make_running(team)
    services.run_stop(run_id=stopping.pk, reason="user_stop", actor=SYSTEM)
    finished = make_run(team)
    _complete(finished)
    ledger_before = LedgerEntry.objects.count()
    preview = services.bulk_stop_preview(team_ids=[team.pk], filter=BulkFilter(every_run=True))
    assert preview.matching == 4
    assert preview.by_status == {"running": 2, "cancel_requested": 1, "completed": 1}
    assert (preview.will_stop, preview.already_stopping, preview.already_finished) == (2, 1, 1)
    assert not preview.needs_confirm
    assert LedgerEntry.objects.count() == ledger_before
    assert not BulkStop.objects.exists()


def test_a_retry_with_the_same_key_answers_the_first_bulk_stop(team, reviewer_actor):
    first_run, _ = make_running(team)
    first = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(status="running"),
        reason="user_stop",
        idempotency_key="k-1",
    )
    make_running(team)  # matches the filter now, but the retry is the same request
    again = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(status="running"),
        reason="user_stop",
        idempotency_key="k-1",
    )
    assert not again.created
    assert again.bulk.pk == first.bulk.pk
    assert [result.run_id for result in again.results] == [first_run.pk]
    assert BulkStop.objects.count() == 1
    assert StopRequest.objects.count() == 1


def test_more_than_the_limit_is_refused_unless_confirmed(team, reviewer_actor, settings):
    settings.SAFESTOP_BULK_STOP_LIMIT = 2
    runs = [make_running(team)[0] for _ in range(3)]
    assert services.bulk_stop_preview(
        team_ids=[team.pk], filter=BulkFilter(status="running")
    ).needs_confirm
    with pytest.raises(BulkTooLarge) as refused:
        services.bulk_stop(
            actor=reviewer_actor,
            team_ids=[team.pk],
            filter=BulkFilter(status="running"),
            reason="user_stop",
        )
    assert "would stop 3 runs, more than 2 at once" in refused.value.detail
    assert refused.value.as_dict()["would_stop"] == 3
    assert not BulkStop.objects.exists()
    assert {reload(run).status for run in runs} == {RunStatus.RUNNING}
    answer = services.bulk_stop(
        actor=reviewer_actor,
        team_ids=[team.pk],
        filter=BulkFilter(status="running"),
        reason="user_stop",
        confirm_large=True,
    )
    assert answer.bulk.counts == {"stopped": 3}


@pytest.mark.parametrize(
    ("bulk_filter", "reason", "field"),
    [
        (BulkFilter(), "user_stop", "filter"),
        (BulkFilter(status="nope"), "user_stop", "status"),
        (BulkFilter(team="globex"), "user_stop", "team"),
        (BulkFilter(ids=("run_\x00",)), "user_stop", "ids"),
        (BulkFilter(status="running"), "manual_takeover", "reason"),
        (BulkFilter(status="running"), "lease_expired", "reason"),
    ],
)
def test_bad_filters_and_reasons_are_refused(team, reviewer_actor, bulk_filter, reason, field):
    make_running(team)
    with pytest.raises(InvalidInput) as refused:
        services.bulk_stop(
            actor=reviewer_actor, team_ids=[team.pk], filter=bulk_filter, reason=reason
        )
    assert refused.value.extra["field"] == field
    assert not StopRequest.objects.exists()
