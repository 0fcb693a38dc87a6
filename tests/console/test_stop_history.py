"""A stop is shown as it happened after it is resolved, and the
pages' labels agree with the run (the progress bar, the stop reasons, the note, late reports,
steps that never started)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings

from handoff import services as handoff_services
from runs import services
from runs.actors import Actor
from runs.models import ExecutionRecord, Run, RunStatus, StopRequest
from tests.support import scenarios

pytestmark = pytest.mark.django_db

AGENT = scenarios.AGENT


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


def test_while_draining_the_bar_highlights_draining_not_drained(as_reviewer, team, bob):
    run, lease = scenarios.running(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.for_user(bob), note="")
    services.lease_heartbeat(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    assert Run.objects.get(pk=run.pk).status == RunStatus.DRAINING
    body = as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    items = re.findall(
        r'<li class="steps-bar__item ([^"]*)">\s*<span class="steps-bar__name">([^<]*)</span>', body
    )
    classes = {name: set(css.split()) for css, name in items}
    assert "is-current" in classes["Draining"]
    assert "is-current" not in classes["Drained"] and "is-done" not in classes["Drained"]
    assert [name for name, css in classes.items() if "is-current" in css] == ["Draining"]


def _stop_reasons(body: str) -> list[str]:
    select = body.split('id="stop-reason"', 1)[1].split("</select>", 1)[0]
    return re.findall(r'<option value="([^"]+)"', select)


def test_people_are_offered_only_their_own_stop_reasons(as_reviewer, as_admin, team):
    run, _lease = scenarios.running(team)
    assert _stop_reasons(as_reviewer.get(f"/runs/{run.pk}/").content.decode()) == [
        "user_stop",
        "dependency_failure",
    ]
    assert _stop_reasons(as_admin.get(f"/runs/{run.pk}/").content.decode()) == [
        "user_stop",
        "dependency_failure",
        "admin_kill",
    ]
    # The budget enforcer's reasons are not a person's: the console form refuses them.
    as_reviewer.post(f"/runs/{run.pk}/stop/", {"reason": "budget_exhausted", "note": ""})
    assert not StopRequest.objects.filter(run=run).exists()


def test_the_stop_note_is_optional_on_the_page_and_in_the_readme(as_reviewer, team):
    run, _lease = scenarios.running(team)
    body = as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    note = re.search(r'<textarea id="stop-note"[^>]*>', body)
    assert note and "required" not in note.group(0)
    readme = (Path(settings.BASE_DIR) / "README.md").read_text()
    assert "optional note" in readme and "ask for a reason and a\n  note" not in readme
    as_reviewer.post(f"/runs/{run.pk}/stop/", {"reason": "user_stop", "note": ""})
    assert StopRequest.objects.filter(run=run).count() == 1


def test_a_call_reported_after_the_stop_is_counted_and_unstarted_steps_say_so(
    as_reviewer, team, bob
):
    run, lease = scenarios.running(team, write_open=True)
    call = ExecutionRecord.objects.get(run=run, side_effect="write")
    services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.for_user(bob), note="")
    services.tool_result_report(
        run_id=run.pk,
        tool_call_id=call.tool_call_id,
        execution_state="succeeded",
        actor=AGENT,
        observation="deployed",
    )
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
    )
    assert Run.objects.get(pk=run.pk).status == RunStatus.STOPPED_CLEANLY
    body = as_reviewer.get(f"/runs/{run.pk}/packets/2/").content.decode()
    assert 'tag--warn">after stop' in body  # the call's row says it
    late = body.split('id="late-title"', 1)[1].split("</section>", 1)[0]
    assert '<span class="count">1</span>' in late and call.tool_call_id in late
    assert "Nothing." not in late
    pending = body.split('id="packet-pending"', 1)[1].split("</section>", 1)[0]
    assert "Not done" not in pending
    assert "not started" in pending and "Not started" in pending
