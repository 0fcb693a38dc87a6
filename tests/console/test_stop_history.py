"""Points 4 and 6 of issue 15: a stop is shown as it happened after it is resolved, and the
pages' labels agree with the run (the progress bar, the stop reasons, the note, late reports,
steps that never started)."""

from __future__ import annotations

import re

import pytest

from handoff import services as handoff_services
from runs.actors import Actor
from runs.models import Run, RunStatus
from tests.support import scenarios

pytestmark = pytest.mark.django_db


def _resolved_dirty(team, bob) -> Run:
    run = scenarios.stopped_dirty(team, by=Actor.for_user(bob))
    call = run.execution_records.get(side_effect="write")
    handoff_services.resolution_record(
        run_id=run.pk,
        target="tool_call",
        target_id=call.tool_call_id,
        decision="not_applied",
        evidence="Deploy API lists no deployment for this operation id",
        actor=Actor.for_user(bob),
    )
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED_CLEANLY
    return run


def _bar_names(body: str) -> list[str]:
    return re.findall(r'<span class="steps-bar__name">([^<]*)</span>', body)


def test_a_resolved_run_shows_its_stop_as_dirty_then_the_resolution_then_clean(
    as_reviewer, team, bob
):
    run = _resolved_dirty(team, bob)
    body = as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    assert _bar_names(body)[-1] == "Stopped dirty"  # not "Stopped cleanly" next to a red tag
    history = body.split('data-testid="stop-history"', 1)[1].split("</ol>", 1)[0]
    dirty_at = history.index("Stopped dirty")
    resolved_at = history.index("Resolved</strong> by bob")
    clean_at = history.index("Stopped cleanly")
    assert dirty_at < resolved_at < clean_at
    assert "Deploy API lists no deployment" in history and "not applied" in history
    assert re.search(r"Stopped dirty</strong> at \+[\d.]+ (ms|s)", history)


def test_the_stop_packet_of_a_resolved_run_tells_the_same_history(as_reviewer, team, bob):
    run = _resolved_dirty(team, bob)
    body = as_reviewer.get(f"/runs/{run.pk}/packets/2/").content.decode()
    status = body.split('id="packet-status"', 1)[1].split("</section>", 1)[0]
    history = status.split('data-testid="stop-history"', 1)[1]
    assert (
        history.index("Stopped dirty")
        < history.index("Resolved</strong> by bob")
        < history.index("Stopped cleanly")
    )
    assert "Deploy API lists no deployment" in history


def test_a_clean_stop_has_no_history_to_tell(as_reviewer, team, bob):
    run = scenarios.stopped_cleanly(team, by=Actor.for_user(bob))
    body = as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    assert _bar_names(body)[-1] == "Stopped cleanly"
    assert 'data-testid="stop-history"' not in body
