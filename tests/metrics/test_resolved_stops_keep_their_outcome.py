"""A dirty stop that a reviewer later resolved is still counted as a dirty stop: the figures
describe how the stop ended, as the run and packet pages do."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from handoff.selectors import stop_quality
from handoff.services import resolution_record
from runs import services
from runs.actors import Actor
from runs.models import RunStatus
from tests.support.scenarios import AGENT, new_run, start

pytestmark = pytest.mark.django_db

REVIEWER = Actor(kind="user", id="2", name="bob")


def dirty_stop(team):
    run = new_run(team)
    lease = start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="call_deploy",
        tool="deploy",
        side_effect="write",
        actor=AGENT,
    )
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED_DIRTY
    return run


def figures(team):
    now = timezone.now()
    return stop_quality(since=now - timedelta(hours=1), until=now + timedelta(minutes=1))


def test_a_resolved_dirty_stop_is_still_a_dirty_stop_in_the_figures(team):
    run = dirty_stop(team)
    before = figures(team)
    assert (before["stopped_cleanly"], before["stopped_dirty"]) == (0, 1)
    assert before["stopped_dirty_resolved"] == 0
    resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id="call_deploy",
        decision="not_applied",
        evidence="deploy log shows no release",
        actor=REVIEWER,
    )
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED_CLEANLY
    after = figures(team)
    assert (after["stopped_cleanly"], after["stopped_dirty"]) == (0, 1)
    assert after["stopped_dirty_resolved"] == 1
