"""The stop packet page: the DESIGN §4 snapshot, JSON download, printable layout, and the
resolution controls that bring a stopped_dirty run to stopped_cleanly."""

from __future__ import annotations

import json

import pytest

from handoff.models import Resolution
from runs.actors import Actor
from runs.models import Run, RunStatus
from tests.support.htmx import htmx
from tests.support.scenarios import new_run, stopped_dirty

pytestmark = pytest.mark.django_db


def _reload(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def dirty(team, bob) -> Run:
    return stopped_dirty(team, by=Actor.for_user(bob))


def test_latest_packet_redirects_to_its_epoch(as_viewer, dirty):
    response = as_viewer.get(f"/runs/{dirty.pk}/packet/")
    assert response.status_code == 302 and response["Location"] == f"/runs/{dirty.pk}/packets/2/"


def test_a_run_without_a_packet_is_a_404(as_viewer, team):
    run = new_run(team)
    assert as_viewer.get(f"/runs/{run.pk}/packet/").status_code == 404


def test_packet_page_shows_the_unknowns_and_the_frozen_outbox(as_reviewer, dirty):
    body = as_reviewer.get(f"/runs/{dirty.pk}/packets/2/").content.decode()
    call = dirty.execution_records.get(side_effect="write")
    assert "What nobody knows yet" in body
    assert call.tool_call_id in body and call.operation_id in body
    assert "query deploy-" in body  # the recovery action: never "retry"
    assert 'name="decision" value="applied"' in body and 'name="evidence"' in body
    item = dirty.outbox_items.get()
    assert item.public_id in body and f"/outbox/{item.pk}/release/" in body
    assert "1</strong> of 1 unknown still open" in body
    assert 'class="btn btn--small" href="/runs/' in body and "Download JSON" in body


def test_json_download_is_the_snapshot(as_viewer, dirty):
    response = as_viewer.get(f"/runs/{dirty.pk}/packets/2.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert f"stop-packet-{dirty.pk}-epoch2.json" in response["Content-Disposition"]
    data = json.loads(response.content)
    assert data == dirty.stop_packets.get().snapshot
    for key in (
        "run_id",
        "stop_epoch",
        "stop_reason",
        "requested_by",
        "requested_at",
        "stopped_at",
        "state",
        "lease_released",
        "resume_from",
        "frozen_outbox_ids",
        "in_flight_outbox_ids",
        "completed_steps",
        "pending_steps",
        "artifacts",
        "unconfirmed_side_effects",
        "unapplied_steering",
        "late_writes_rejected",
    ):
        assert key in data, key
    assert data["state"] == "stopped_dirty"


def test_resolving_the_last_unknown_makes_the_run_stopped_cleanly(as_reviewer, dirty):
    call = dirty.execution_records.get(side_effect="write")
    response = as_reviewer.post(
        f"/runs/{dirty.pk}/resolve/",
        {
            "target": "tool_call",
            "target_id": call.tool_call_id,
            "decision": "not_applied",
            "evidence": "deploy API shows no deployment with that id",
        },
        **htmx(),
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<article class="unknown-card is-resolved"')
    assert "the run is now stopped cleanly" in body
    assert 'id="packet-status"' in body and 'hx-swap-oob="true"' in body
    assert _reload(dirty).status == RunStatus.STOPPED_CLEANLY
    resolution = Resolution.objects.get(run=dirty)
    assert resolution.by == "bob" and resolution.decision == "not_applied"
    page = as_reviewer.get(f"/runs/{dirty.pk}/packets/2/").content.decode()
    assert "Resolved as <strong>not applied</strong> by bob" in page
    assert "Every unknown is resolved" in page


def test_resolving_without_htmx_redirects_back_to_the_packet(as_reviewer, dirty):
    call = dirty.execution_records.get(side_effect="write")
    response = as_reviewer.post(
        f"/runs/{dirty.pk}/resolve/",
        {
            "target": "tool_call",
            "target_id": call.tool_call_id,
            "decision": "applied",
            "evidence": "seen in prod",
        },
    )
    assert response.status_code == 302 and response["Location"] == f"/runs/{dirty.pk}/packet/"
    assert _reload(dirty).status == RunStatus.STOPPED_CLEANLY


def test_missing_evidence_is_an_error_on_the_card(as_reviewer, dirty):
    call = dirty.execution_records.get(side_effect="write")
    response = as_reviewer.post(
        f"/runs/{dirty.pk}/resolve/",
        {
            "target": "tool_call",
            "target_id": call.tool_call_id,
            "decision": "applied",
            "evidence": "",
        },
        **htmx(),
    )
    assert response.status_code == 200
    assert "evidence" in response.content.decode() and 'role="alert"' in response.content.decode()
    assert _reload(dirty).status == RunStatus.STOPPED_DIRTY


def test_a_viewer_cannot_resolve(as_viewer, dirty):
    call = dirty.execution_records.get(side_effect="write")
    page = as_viewer.get(f"/runs/{dirty.pk}/packets/2/").content.decode()
    assert "Record resolution" not in page
    response = as_viewer.post(
        f"/runs/{dirty.pk}/resolve/",
        {
            "target": "tool_call",
            "target_id": call.tool_call_id,
            "decision": "applied",
            "evidence": "x",
        },
    )
    assert response.status_code == 403
    assert _reload(dirty).status == RunStatus.STOPPED_DIRTY


def test_release_a_frozen_item_from_the_packet(as_reviewer, dirty):
    item = dirty.outbox_items.get()
    response = as_reviewer.post(
        f"/runs/{dirty.pk}/packet/outbox/{item.pk}/release/", {}, **htmx("packet-frozen")
    )
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith('<section id="packet-frozen"')
    assert "released: it will be dispatched" in body
    item.refresh_from_db()
    assert item.status == "released"


def test_packet_status_fragment_for_live_refresh(as_viewer, dirty):
    body = as_viewer.get(f"/runs/{dirty.pk}/packets/2/", **htmx("packet-status")).content.decode()
    assert body.lstrip().startswith('<section id="packet-status"') and "<html" not in body
