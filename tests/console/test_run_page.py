"""The run page and its actions: roles, Stop / Take over / Resume / Close, steering, frozen
outbox decisions, htmx fragments vs. redirects, domain errors as messages, query counts."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.actors import Actor
from runs.models import Artifact, OutboxItem, OutboxStatus, Run, RunStatus, StopRequest
from tests.support.htmx import htmx
from tests.support.scenarios import (
    AGENT,
    handed_off,
    new_run,
    outbox_seen,
    running,
    start,
    stopped_cleanly,
    work,
)

pytestmark = pytest.mark.django_db

# 16, one for the MCP gateway's session row (the client and upstream a run came through), and
# one for the run's policy hits (what a team's policies did or would have done on it), and one
# for the run's approvals (id, rule, decision, who)
RUN_PAGE_MAX_QUERIES = 19


def _reload(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


def test_run_page_shows_state_lease_steps_calls_outbox_and_ledger(as_viewer, team):
    run, lease = running(team)
    body = as_viewer.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-status="running"' in body
    assert lease.worker_id in body  # lease holder
    assert "data-ago" in body  # heartbeat age
    for step in ("Plan", "Search"):
        assert step in body
    assert "web.search" in body and "succeeded" in body  # tool calls with their states
    assert "outbox_" in body and "cfo@example.com" in body  # the outbox
    assert "checkpoint_02" in body and "draft-0.md" in body  # checkpoints and artifacts
    assert "run.created" in body and "lease.acquired" in body  # this run's ledger
    assert f'ws-connect="/ws/runs/{run.pk}/"' in body


def test_viewer_sees_no_stop_button_and_a_forged_post_is_403(as_viewer, team):
    run, _lease = running(team)
    body = as_viewer.get(f"/runs/{run.pk}/").content.decode()
    assert "Confirm stop" not in body and "Take over" not in body
    assert "need the reviewer role" in body
    for path, data in [
        ("stop", {"reason": "user_stop"}),
        ("takeover", {}),
        ("steering", {"text": "x"}),
        ("resume", {}),
        ("close", {}),
    ]:
        response = as_viewer.post(f"/runs/{run.pk}/{path}/", data)
        assert response.status_code == 403, path
    assert _reload(run).status == RunStatus.RUNNING
    assert not StopRequest.objects.filter(run=run).exists()


def test_another_teams_run_is_not_found(as_outsider, team):
    run = new_run(team)
    assert as_outsider.get(f"/runs/{run.pk}/").status_code == 404
    assert as_outsider.post(f"/runs/{run.pk}/stop/", {"reason": "user_stop"}).status_code == 404
    assert _reload(run).status == RunStatus.PENDING


def test_stop_without_htmx_redirects_and_records_one_stop(as_reviewer, team, bob):
    run, _lease = running(team)
    response = as_reviewer.post(
        f"/runs/{run.pk}/stop/", {"reason": "user_stop", "note": "wrong data"}
    )
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    run = _reload(run)
    assert run.status == RunStatus.CANCEL_REQUESTED  # a live lease: waiting for the worker
    assert run.stop_reason == "user_stop" and run.stop_requested_by == "bob" and run.stop_epoch == 2
    page = as_reviewer.get(response["Location"]).content.decode()
    assert "Stop recorded (user stop)" in page
    assert "Cancel requested" in page and "wrong data" in page


def test_double_submitted_stop_stops_once(as_reviewer, team):
    run, _lease = running(team)
    first = as_reviewer.post(
        f"/runs/{run.pk}/stop/", {"reason": "user_stop"}, **htmx("run-actions")
    )
    second = as_reviewer.post(
        f"/runs/{run.pk}/stop/", {"reason": "user_stop"}, **htmx("run-actions")
    )
    assert first.status_code == second.status_code == 200
    assert StopRequest.objects.filter(run=run).count() == 1
    assert _reload(run).stop_epoch == 2
    assert "nothing new was done" in second.content.decode()


def test_htmx_stop_answers_with_fragments_not_a_redirect(as_reviewer, team):
    run = new_run(team)  # no worker: cancel_requested → draining → stopped_cleanly at once
    response = as_reviewer.post(
        f"/runs/{run.pk}/stop/", {"reason": "user_stop"}, **htmx("run-actions")
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="run-actions"')
    assert '<section id="run-summary"' in body and 'id="run-detail"' in body
    assert body.count('hx-swap-oob="true"') == 2
    assert 'data-status="stopped_cleanly"' in body
    assert _reload(run).status == RunStatus.STOPPED_CLEANLY


def test_admin_kill_is_only_offered_to_admins(as_reviewer, as_admin, team):
    run, _lease = running(team)
    assert "admin_kill" not in as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    assert "admin_kill" in as_admin.get(f"/runs/{run.pk}/").content.decode()
    refused = as_reviewer.post(
        f"/runs/{run.pk}/stop/", {"reason": "admin_kill"}, **htmx("run-actions")
    )
    assert refused.status_code == 200 and "Select a valid choice" in refused.content.decode()
    assert _reload(run).status == RunStatus.RUNNING
    as_admin.post(f"/runs/{run.pk}/stop/", {"reason": "admin_kill"})
    assert _reload(run).stop_reason == "admin_kill"


def test_domain_errors_are_messages_not_500(as_reviewer, team):
    run, _lease = running(team)
    closing = as_reviewer.post(f"/runs/{run.pk}/close/", {"note": "x"}, **htmx("run-actions"))
    assert closing.status_code == 200
    assert (
        "cannot be closed" in closing.content.decode()
        and 'role="alert"' in closing.content.decode()
    )
    plain = as_reviewer.post(f"/runs/{run.pk}/resume/", {})
    assert plain.status_code == 302
    assert "cannot be resumed" in as_reviewer.get(plain["Location"]).content.decode()
    assert _reload(run).status == RunStatus.RUNNING


def test_take_over_a_running_run_ends_handed_off_after_the_drain(as_reviewer, team, bob):
    run, lease = running(team)
    response = as_reviewer.post(
        f"/runs/{run.pk}/takeover/", {"note": "mine now"}, **htmx("run-actions")
    )
    assert "handed off as soon as it is stopped cleanly" in response.content.decode()
    assert _reload(run).status == RunStatus.CANCEL_REQUESTED
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run = _reload(run)
    assert run.status == RunStatus.HANDED_OFF
    assert run.handoffs.get().assignee == bob


def test_resume_from_a_checkpoint_and_close(as_reviewer, team):
    run = stopped_cleanly(team)
    response = as_reviewer.post(
        f"/runs/{run.pk}/resume/", {"checkpoint": "checkpoint_01"}, **htmx("run-actions")
    )
    assert "Resumed from checkpoint_01" in response.content.decode()
    run = _reload(run)
    assert (
        run.status == RunStatus.PENDING
        and run.resume_from == "checkpoint_01"
        and run.stop_epoch == 3
    )
    other = stopped_cleanly(team)
    as_reviewer.post(f"/runs/{other.pk}/close/", {"note": "not needed"})
    assert _reload(other).status == RunStatus.CANCELLED


def test_steering_is_queued_and_shown(as_reviewer, team):
    run, _lease = running(team)
    response = as_reviewer.post(
        f"/runs/{run.pk}/steering/", {"text": "Prefer the EU region"}, **htmx("steering-form-box")
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="steering-form-box"')
    assert "Queued for the agent." in body
    assert "Prefer the EU region" in body  # in the out-of-band detail region
    empty = as_reviewer.post(
        f"/runs/{run.pk}/steering/", {"text": "  "}, **htmx("steering-form-box")
    )
    assert "required" in empty.content.decode().lower()


def test_unapplied_steering_is_carried_over_or_discarded(as_reviewer, team, bob):
    run = handed_off(team, by=Actor.for_user(bob))
    message = run.steering_messages.get()
    assert message.status == "unapplied_at_stop"
    response = as_reviewer.post(
        f"/runs/{run.pk}/steering/{message.pk}/decide/",
        {"decision": "carry_over"},
        **htmx("run-detail"),
    )
    assert response.status_code == 200 and "Carried over" in response.content.decode()
    message.refresh_from_db()
    assert message.status == "carried_over"


def test_frozen_outbox_item_is_released_or_discarded(as_reviewer, team):
    run = stopped_cleanly(team)
    [item] = outbox_seen(run)
    assert item.status == "frozen"
    page = as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    assert f"/runs/{run.pk}/outbox/{item.pk}/release/" in page
    response = as_reviewer.post(
        f"/runs/{run.pk}/outbox/{item.pk}/discard/", {}, **htmx("run-detail")
    )
    assert response.status_code == 200 and "discarded" in response.content.decode()
    item.refresh_from_db()
    assert item.status == "discarded"
    assert as_reviewer.post(f"/runs/{run.pk}/outbox/{item.pk}/explode/", {}).status_code == 404


def test_live_fragments_by_target(as_viewer, team):
    run, _lease = running(team)
    summary = as_viewer.get(f"/runs/{run.pk}/", **htmx("run-summary")).content.decode()
    assert summary.lstrip().startswith('<section id="run-summary"')
    assert f'data-seq="{_reload(run).change_seq}"' in summary
    assert 'id="run-detail" class="run-detail" hx-swap-oob="true"' in summary
    assert 'id="run-actions"' not in summary
    with_actions = as_viewer.get(
        f"/runs/{run.pk}/", {"with": "actions"}, **htmx("run-summary")
    ).content.decode()
    assert (
        '<section id="run-actions"' in with_actions
        and with_actions.count('hx-swap-oob="true"') == 2
    )
    actions = as_viewer.get(f"/runs/{run.pk}/", **htmx("run-actions")).content.decode()
    assert actions.lstrip().startswith('<section id="run-actions"') and "<html" not in actions


def _busy_run(team, size: int) -> Run:
    steps = tuple(f"step{i}" for i in range(size))
    run = new_run(team, steps=steps)
    lease = start(run)
    work(run, lease, steps=size, calls_per_step=1, outbox=size, artifacts=size)
    for i in range(size):
        services.steering_queue(run_id=run.pk, text=f"hint {i}", actor=AGENT)
    return _reload(run)


def test_run_page_queries_do_not_grow_with_rows(as_reviewer, team, django_assert_max_num_queries):
    small = _busy_run(team, 5)
    big = _busy_run(team, 50)
    with CaptureQueriesContext(connection) as few:
        assert as_reviewer.get(f"/runs/{small.pk}/").status_code == 200
    with CaptureQueriesContext(connection) as many:
        response = as_reviewer.get(f"/runs/{big.pk}/")
    assert (
        response.status_code == 200
        and response.content.decode().count('class="timeline__item') == 50
    )
    assert len(many) == len(few)
    with django_assert_max_num_queries(RUN_PAGE_MAX_QUERIES):
        as_reviewer.get(f"/runs/{big.pk}/", **htmx("run-summary"))


def test_a_long_run_shows_its_newest_steps_and_calls_and_every_unresolved_call(
    as_viewer, team, settings
):
    import console.selectors.run as console_selectors

    window = 5
    original = console_selectors.RUN_STEP_WINDOW
    console_selectors.RUN_STEP_WINDOW = window
    try:
        run = services.run_create(
            team=team,
            title="long",
            agent="bot",
            actor=AGENT,
            steps=[services.PlannedStep(f"step_{n:02d}") for n in range(12)],
        )
        lease = services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=60, actor=AGENT)
        services.permit_request(
            run_id=run.pk,
            epoch=lease.epoch,
            tool_call_id="call_old_write",
            tool="deploy",
            side_effect="write",
            actor=AGENT,
        )
        services.tool_result_report(
            run_id=run.pk, tool_call_id="call_old_write", execution_state="unknown", actor=AGENT
        )
        for n in range(8):
            services.permit_request(
                run_id=run.pk,
                epoch=lease.epoch,
                tool_call_id=f"call_read_{n}",
                tool="search",
                actor=AGENT,
            )
        short = services.run_create(
            team=team, title="short", agent="bot", actor=AGENT, steps=[services.PlannedStep("only")]
        )
        with CaptureQueriesContext(connection) as short_queries:
            as_viewer.get(f"/runs/{short.pk}/")
        with CaptureQueriesContext(connection) as long_queries:
            body = as_viewer.get(f"/runs/{run.pk}/").content.decode()
        # Past the window the totals come with the rows (no extra COUNT queries).
        assert len(long_queries) == len(short_queries)
        steps = _section(body, "steps")
        calls = _section(body, "tool-calls")
        assert "Showing the latest 5 of 12 steps" in steps
        assert "step_11" in steps and "step_00" not in steps
        assert "call_read_7" in calls and "call_read_0" not in calls
        assert "call_old_write" in calls  # unresolved: shown whatever its age
        assert "Showing the latest 6 of 9 tool calls" in calls  # 5 newest + the old unresolved one
        everything = as_viewer.get(f"/runs/{run.pk}/?all=1").content.decode()
        assert "Showing the latest" not in everything
        assert "step_00" in everything and "call_read_0" in everything
    finally:
        console_selectors.RUN_STEP_WINDOW = original


def test_sent_outbox_items_and_artifacts_are_windowed_open_items_never(
    as_viewer, team, monkeypatch
):
    import console.selectors.run as console_selectors

    monkeypatch.setattr(console_selectors, "RUN_HISTORY_WINDOW", 3)
    run = services.run_create(team=team, title="chatty", agent="bot", actor=AGENT)

    def item(key: str, status: str) -> OutboxItem:
        return OutboxItem(
            run=run,
            transport="webhook",
            destination="https://hooks.example/x",
            idempotency_key=key,
            status=status,
            enqueue_epoch=1,
        )

    # Two old items still open (frozen, unknown), then eight sent ones, newer.
    OutboxItem.objects.bulk_create(
        [item("old-frozen", OutboxStatus.FROZEN), item("old-unknown", OutboxStatus.UNKNOWN)]
        + [item(f"sent-{n}", OutboxStatus.SENT) for n in range(8)]
    )
    Artifact.objects.bulk_create([Artifact(run=run, name=f"report-{n}.pdf") for n in range(7)])
    short = services.run_create(team=team, title="short", agent="bot", actor=AGENT)
    with CaptureQueriesContext(connection) as short_queries:
        as_viewer.get(f"/runs/{short.pk}/")
    with CaptureQueriesContext(connection) as long_queries:
        body = as_viewer.get(f"/runs/{run.pk}/").content.decode()
    assert len(long_queries) == len(short_queries)  # the totals ride along with the rows

    outbox = _section(body, "outbox")
    assert "old-frozen" in outbox and "old-unknown" in outbox  # open: whatever their age
    assert "sent-7" in outbox and "sent-5" in outbox and "sent-4" not in outbox
    assert "5 of 10" in outbox and "show all" in outbox
    artifacts = body[body.index('id="artifacts-title"') :]
    assert "Showing the latest 3 of 7 artifacts" in artifacts
    assert "report-6.pdf" in artifacts and "report-3.pdf" not in artifacts

    everything = as_viewer.get(f"/runs/{run.pk}/?all=1").content.decode()
    assert "sent-0" in everything and "report-0.pdf" in everything
    assert "5 of 10" not in everything and "Showing the latest" not in everything


def _section(body: str, section_id: str) -> str:
    start = body.index(f'<section id="{section_id}"')
    return body[start : body.index("</section>", start)]
