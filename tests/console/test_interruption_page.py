"""An interrupted run with an unconfirmed write reaches a person: the runs
page marks it, the run page says why Resume waits and offers it once resolved, `/packet/` is its
interruption packet with a control per unknown, and a missing packet's 404 says what is true."""

from __future__ import annotations

import re

import pytest

from runs.models import OutboxStatus, Run, RunStatus
from tests.support.htmx import htmx
from tests.support.scenarios import interrupted, new_run

pytestmark = pytest.mark.django_db


def _write_id(run: Run) -> str:
    return run.execution_records.get(side_effect="write").tool_call_id


def _resolve(client, run: Run, target: str, target_id: str, **headers):
    return client.post(
        f"/runs/{run.pk}/resolve/",
        {
            "target": target,
            "target_id": target_id,
            "decision": "not_applied",
            "evidence": "not in the deploy history",
        },
        **headers,
    )


def _row(body: str, run: Run) -> str:
    match = re.search(rf'<tr [^>]*data-run-id="{run.pk}".*?</tr>', body, re.S)
    assert match, f"no row for {run.pk}"
    return match.group(0)


def test_the_runs_page_marks_an_interrupted_run_with_unknowns(as_viewer, team):
    needing = interrupted(team)
    clean = interrupted(team, write_open=False)
    body = as_viewer.get("/").content.decode()
    row = _row(body, needing)
    assert "row--attention" in row and "needs resolution" in row
    assert f'href="/runs/{needing.pk}/packet/"' in row
    assert "needs resolution" not in _row(body, clean)
    assert 'data-testid="interrupted-banner"' in body
    assert "1 interrupted run needs resolution" in body


def test_the_run_page_says_why_resume_waits_then_offers_it(as_reviewer, team):
    run = interrupted(team)
    body = as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="interruption-banner"' in body
    assert "needs resolution · 1 unknown" in body
    assert 'data-testid="resume-disabled"' in body and "Confirm resume" not in body
    assert "resolve the interruption&#x27;s unknowns before resuming" in body
    assert f'href="/runs/{run.pk}/packet/"' in body

    assert _resolve(as_reviewer, run, "tool_call", _write_id(run)).status_code == 302
    body = as_reviewer.get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="interruption-banner"' not in body
    assert 'data-testid="resume-disabled"' not in body and "Confirm resume" in body
    response = as_reviewer.post(f"/runs/{run.pk}/resume/", {"checkpoint": ""})
    assert response.status_code == 302
    assert Run.objects.get(pk=run.pk).status == RunStatus.PENDING


def test_a_live_summary_refresh_brings_an_interrupted_runs_actions_along(as_reviewer, team):
    run = interrupted(team)
    _resolve(as_reviewer, run, "tool_call", _write_id(run))
    body = as_reviewer.get(f"/runs/{run.pk}/", **htmx("run-summary")).content.decode()
    assert 'id="run-actions"' in body and "Confirm resume" in body


def test_packet_of_an_interrupted_run_is_its_interruption_packet(as_reviewer, team):
    run = interrupted(team, outbox_in_flight=True)
    item = run.outbox_items.get(status=OutboxStatus.DISPATCHING)
    response = as_reviewer.get(f"/runs/{run.pk}/packet/")
    body = response.content.decode()
    assert response.status_code == 200
    assert "Interruption packet" in body and "lease expired" in body
    assert "<strong>2</strong> of 2 unknowns still open" in body
    assert f'name="target_id" value="{_write_id(run)}"' in body
    assert f'name="target_id" value="{item.public_id}"' in body
    assert "team you are not in" not in body


def test_a_viewer_sees_the_interruption_packet_without_controls(as_viewer, team):
    run = interrupted(team)
    body = as_viewer.get(f"/runs/{run.pk}/packet/").content.decode()
    assert "Interruption packet" in body and 'name="target_id"' not in body
    assert "Resolving needs the reviewer role." in body


def test_resolving_the_last_unknown_of_an_interruption_says_it_can_resume(as_reviewer, team):
    run = interrupted(team)
    response = _resolve(as_reviewer, run, "tool_call", _write_id(run), **htmx())
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<article class="unknown-card is-resolved"')
    assert "the run can be resumed from its page" in body
    assert 'id="interruption-status"' in body and 'hx-swap-oob="true"' in body
    assert "Every unknown is resolved" in body
    assert Run.objects.get(pk=run.pk).status == RunStatus.INTERRUPTED


def test_a_missing_stop_packet_of_an_interrupted_run_says_so_even_to_an_admin(as_admin, team):
    run = interrupted(team)
    response = as_admin.get(f"/runs/{run.pk}/packets/1/")
    body = response.content.decode()
    assert response.status_code == 404
    assert "interrupted, not stopped" in body and "team you are not in" not in body
    assert f'href="/runs/{run.pk}/packet/"' in body  # its interruption


def test_a_run_that_never_stopped_has_no_packet_and_says_so(as_viewer, team):
    run = new_run(team)
    response = as_viewer.get(f"/runs/{run.pk}/packet/")
    body = response.content.decode()
    assert response.status_code == 404
    assert "has no stop packet: it has not been stopped (it is pending)" in body
    assert "team you are not in" not in body


def test_an_outsider_still_gets_the_plain_404(as_outsider, team):
    run = interrupted(team)
    response = as_outsider.get(f"/runs/{run.pk}/packet/")
    assert response.status_code == 404
    assert "interrupted" not in response.content.decode()


def test_the_quality_page_counts_an_interruption_resolved_and_resumed(as_reviewer, team):
    run = interrupted(team)
    _resolve(as_reviewer, run, "tool_call", _write_id(run))
    assert "0 of 1 interrupted runs" in as_reviewer.get("/quality/").content.decode()
    as_reviewer.post(f"/runs/{run.pk}/resume/", {"checkpoint": ""})
    assert "1 of 1 interrupted runs" in as_reviewer.get("/quality/").content.decode()


def _recovery(body: str) -> str:
    match = re.search(r"<dt>Recovery</dt><dd><strong>(.*?)</strong>", body, re.S)
    assert match, "no recovery advice"
    return match.group(1)


def test_resolving_an_unknown_brings_the_summary_calls_and_resolutions_along(as_reviewer, team):
    run = interrupted(team)
    call_id = _write_id(run)
    page = as_reviewer.get(f"/runs/{run.pk}/packet/").content.decode()
    advice = _recovery(page)
    assert advice and advice != "confirm manually"
    assert 'id="packet-resolutions"' in page  # there, hidden, for the first one to land in

    body = _resolve(as_reviewer, run, "tool_call", call_id, **htmx()).content.decode()
    for region in ("interruption-head", "packet-calls", "packet-resolutions"):
        assert re.search(rf'id="{region}"[^>]*hx-swap-oob="true"', body), region
    head = body[body.index('id="interruption-head"') :]
    head = head[: head.index("</section>")]
    assert "tag--ok" in head and "nothing" in head  # "Unknown now": nothing any more
    resolutions = body[body.index('id="packet-resolutions"') :]
    resolutions = resolutions[: resolutions.index("</section>")]
    assert " hidden " not in resolutions and "not in the deploy history" in resolutions
    assert call_id in body[body.index('id="packet-calls"') :]
    # the advice the reviewer acted on stays as it was
    assert _recovery(body) == advice
    assert _recovery(as_reviewer.get(f"/runs/{run.pk}/packet/").content.decode()) == advice


def test_a_live_refresh_of_the_interruption_brings_the_same_regions(as_reviewer, team):
    run = interrupted(team)
    body = as_reviewer.get(
        f"/runs/{run.pk}/packet/", **htmx("interruption-status")
    ).content.decode()
    assert body.lstrip().startswith('<section id="interruption-status"')
    for region in ("interruption-head", "packet-calls", "packet-resolutions"):
        assert re.search(rf'id="{region}"[^>]*hx-swap-oob="true"', body), region
