"""Bulk stop from the runs page (DESIGN §12): checkboxes, preview, confirm, the result page."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import BulkStop, RunStatus, StopRequest
from tests.support.scenarios import make_run, make_running, reload

pytestmark = pytest.mark.django_db

PREVIEW = "/stops/bulk/preview/"
CONFIRM = "/stops/bulk/"
HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "bulk-dialog-slot"}


def test_reviewers_get_checkboxes_and_stop_all_matching(as_reviewer, team):
    run, _ = make_running(team)
    make_run(team)
    page = as_reviewer.get("/?status=running").content.decode()
    assert f'name="ids" value="{run.pk}"' in page
    assert 'data-testid="bulk-stop-matching"' in page
    assert "Stop all 1 matching" in page
    assert 'name="status" value="running"' in page  # the current filters go with it


def test_viewers_see_no_checkboxes(as_viewer, team):
    make_running(team)
    page = as_viewer.get("/").content.decode()
    assert 'name="ids"' not in page
    assert "bulk-form" not in page


def test_viewers_may_not_preview_or_stop(as_viewer, team):
    run, _ = make_running(team)
    assert as_viewer.post(PREVIEW, {"scope": "selected", "ids": [run.pk]}).status_code == 403
    response = as_viewer.post(
        CONFIRM,
        {"scope": "selected", "ids": [run.pk], "reason": "user_stop", "idempotency_key": "k"},
    )
    assert response.status_code == 403
    assert reload(run).status == RunStatus.RUNNING


def test_preview_says_how_many_runs_in_which_states_and_stops_nothing(as_reviewer, team):
    running = [make_running(team)[0] for _ in range(2)]
    stopping, _ = make_running(team)
    as_reviewer.post(f"/runs/{stopping.pk}/stop/", {"reason": "user_stop"})
    ids = [run.pk for run in [*running, stopping]]
    response = as_reviewer.post(PREVIEW, {"scope": "selected", "ids": ids}, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    assert "<dialog" in html and "Stop 2 runs?" in html
    assert "<b>2</b> will be stopped" in html
    assert "<b>1</b> already stopping" in html
    for run_id in ids:
        assert f'name="ids" value="{run_id}"' in html  # the confirm form carries the selection
    assert 'name="idempotency_key"' in html
    assert {reload(run).status for run in running} == {RunStatus.RUNNING}
    assert not BulkStop.objects.exists()


def test_preview_of_all_matching_uses_the_filters(as_reviewer, team):
    make_running(team)
    make_running(team)
    make_run(team)
    response = as_reviewer.post(
        PREVIEW,
        {"scope": "matching", "status": "pending", "agent": "", "team": "", "q": ""},
        **HTMX,
    )
    assert "Stop 1 run?" in response.content.decode()


def test_an_empty_selection_is_said_plainly(as_reviewer, team):
    response = as_reviewer.post(PREVIEW, {"scope": "selected"}, **HTMX)
    assert "Tick at least one run" in response.content.decode()


def test_confirm_stops_each_run_and_the_result_page_lists_them(as_reviewer, team, as_outsider):
    runs = [make_running(team)[0] for _ in range(3)]
    body = {
        "scope": "selected",
        "ids": [run.pk for run in runs],
        "reason": "user_stop",
        "note": "runaway",
        "idempotency_key": "preview-1",
    }
    response = as_reviewer.post(CONFIRM, body)
    bulk = BulkStop.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/stops/bulk/{bulk.bulk_id}/"
    assert bulk.counts == {"stopped": 3}
    assert StopRequest.objects.filter(run__in=runs).count() == 3
    # A second click on the same preview answers the first bulk stop.
    again = as_reviewer.post(CONFIRM, body, HTTP_HX_REQUEST="true")
    assert again["HX-Redirect"] == f"/stops/bulk/{bulk.bulk_id}/"
    assert BulkStop.objects.count() == 1

    page = as_reviewer.get(f"/stops/bulk/{bulk.bulk_id}/")
    html = page.content.decode()
    assert page.status_code == 200
    for run in runs:
        assert f'data-run-id="{run.pk}"' in html
    assert html.count('data-outcome="stopped"') == 3
    assert "runaway" in html
    assert 'data-live="always"' in html  # the rows follow the runs' own frames
    assert as_outsider.get(f"/stops/bulk/{bulk.bulk_id}/").status_code == 404


def test_the_result_fragment_shows_each_runs_status_now(as_reviewer, team, system):
    from runs import services

    run, lease = make_running(team)
    as_reviewer.post(
        CONFIRM,
        {"scope": "selected", "ids": [run.pk], "reason": "user_stop", "idempotency_key": "k"},
    )
    bulk = BulkStop.objects.get()
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=system)
    fragment = as_reviewer.get(
        f"/stops/bulk/{bulk.bulk_id}/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="bulk-results"
    ).content.decode()
    assert fragment.lstrip().startswith('<section id="bulk-results"')
    assert 'data-status="stopped_cleanly"' in fragment


def test_the_result_page_makes_the_same_queries_for_1_run_or_20(as_reviewer, team):
    def queries(n: int, key: str) -> int:
        runs = [make_run(team) for _ in range(n)]
        as_reviewer.post(
            CONFIRM,
            {
                "scope": "selected",
                "ids": [r.pk for r in runs],
                "reason": "user_stop",
                "idempotency_key": key,
            },
        )
        bulk = BulkStop.objects.get(idempotency_key=key)
        with CaptureQueriesContext(connection) as captured:
            assert as_reviewer.get(f"/stops/bulk/{bulk.bulk_id}/").status_code == 200
        return len(captured)

    assert queries(1, "one") == queries(20, "twenty")


def test_more_than_the_limit_asks_for_confirmation(as_reviewer, team, settings):
    settings.SAFESTOP_BULK_STOP_LIMIT = 1
    runs = [make_running(team)[0] for _ in range(2)]
    body = {
        "scope": "selected",
        "ids": [run.pk for run in runs],
        "reason": "user_stop",
        "idempotency_key": "big",
    }
    preview = as_reviewer.post(PREVIEW, {"scope": "selected", "ids": body["ids"]}, **HTMX)
    assert 'data-testid="bulk-confirm-large"' in preview.content.decode()
    refused = as_reviewer.post(CONFIRM, body, **HTMX)
    assert "more than 1 at once" in refused.content.decode()
    assert not BulkStop.objects.exists()
    confirmed = as_reviewer.post(CONFIRM, {**body, "confirm_large": "on"}, **HTMX)
    assert confirmed.status_code == 200 and confirmed["HX-Redirect"]
    assert BulkStop.objects.get().counts == {"stopped": 2}


def test_without_javascript_the_preview_is_a_page_of_its_own(as_reviewer, team):
    run, _ = make_running(team)
    response = as_reviewer.post(PREVIEW, {"scope": "selected", "ids": [run.pk]})
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" in html and "<dialog" in html and " open" in html
    assert 'action="/stops/bulk/"' in html  # the confirm form posts without htmx too


def _preview_id(html: str) -> str:
    match = re.search(r'name="preview_id" value="(bprev_[0-9a-f]+)"', html)
    assert match, "the confirm form carries the preview it confirms"
    return match.group(1)


def test_confirm_stops_the_previewed_runs_not_runs_that_began_matching_since(as_reviewer, team):
    shown = [make_running(team)[0] for _ in range(2)]
    html = as_reviewer.post(
        PREVIEW, {"scope": "matching", "status": "running"}, **HTMX
    ).content.decode()
    newcomer, _ = make_running(team)
    confirmed = as_reviewer.post(
        CONFIRM,
        {
            "scope": "matching",
            "status": "running",
            "reason": "user_stop",
            "idempotency_key": "k-preview",
            "preview_id": _preview_id(html),
        },
        **HTMX,
    )
    assert confirmed["HX-Redirect"]
    bulk = BulkStop.objects.get()
    assert bulk.counts == {"stopped": 2} and bulk.new_since_preview == 1
    assert reload(newcomer).status == RunStatus.RUNNING
    assert {reload(run).status for run in shown} == {RunStatus.CANCEL_REQUESTED}
    page = as_reviewer.get(f"/stops/bulk/{bulk.bulk_id}/").content.decode()
    assert 'data-testid="bulk-new-since-preview"' in page
    assert "1 run began to match the filter after the preview" in page
    # Both runs still drain: the page says the stop was requested, not that they stopped.
    assert page.count('data-state="requested"') == 2
    assert "Stop requested <b>2</b>" in page


def test_a_dirty_stop_shows_on_the_result_page(as_reviewer, team, system):
    from runs import services

    run, lease = make_running(team)
    services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="c1",
        tool="send_email",
        side_effect="write",
        arguments={},
        actor=system,
    )
    as_reviewer.post(
        CONFIRM,
        {"scope": "selected", "ids": [run.pk], "reason": "user_stop", "idempotency_key": "d"},
    )
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=system)
    assert reload(run).status == RunStatus.STOPPED_DIRTY
    page = as_reviewer.get(f"/stops/bulk/{BulkStop.objects.get().bulk_id}/").content.decode()
    assert 'data-state="stopped_dirty"' in page
    assert "Stopped dirty — needs resolution" in page


def test_above_25_runs_the_reviewer_types_the_number(as_reviewer, team):
    runs = [make_run(team) for _ in range(26)]
    ids = [run.pk for run in runs]
    html = as_reviewer.post(PREVIEW, {"scope": "selected", "ids": ids}, **HTMX).content.decode()
    assert 'data-testid="bulk-typed-count"' in html
    body = {
        "scope": "selected",
        "ids": ids,
        "reason": "user_stop",
        "idempotency_key": "typed",
        "preview_id": _preview_id(html),
    }
    refused = as_reviewer.post(CONFIRM, {**body, "typed_count": "25"}, **HTMX)
    assert "Type 26, the number of runs to stop, to confirm." in refused.content.decode()
    assert not BulkStop.objects.exists()
    confirmed = as_reviewer.post(CONFIRM, {**body, "typed_count": "26"}, **HTMX)
    assert confirmed["HX-Redirect"]
    assert BulkStop.objects.get().counts == {"stopped": 26}


def test_the_stop_all_button_counts_only_runs_a_stop_would_change(as_reviewer, team, system):
    from runs import services

    make_running(team)
    make_run(team)
    stopped, _ = make_running(team)
    services.run_stop(run_id=stopped.pk, reason="user_stop", actor=system)
    page = as_reviewer.get("/").content.decode()
    assert "Stop all 2 matching" in page  # running + pending; not the one already stopping
    finished_only = as_reviewer.get("/?status=cancel_requested").content.decode()
    assert re.search(r'data-testid="bulk-stop-matching"[^>]*disabled', finished_only)
