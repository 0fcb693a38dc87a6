"""GET /runs/{id}/interruption-packet/: an interrupted run's unknowns, resolvable with the same
POST /resolutions/ as a dirty stop's; the stop-packet endpoint says the run was interrupted."""

from __future__ import annotations

import pytest

from runs.models import OutboxStatus
from tests.support.api import url
from tests.support.scenarios import interrupted, new_run

pytestmark = pytest.mark.django_db


def test_an_interrupted_runs_packet_lists_its_unknowns(api, team, reviewer_token):
    run = interrupted(team, outbox_in_flight=True)
    item = run.outbox_items.get(status=OutboxStatus.DISPATCHING)
    response = api.get(url(run, "interruption-packet/"), reviewer_token)
    assert response.status_code == 200
    body = response.json()
    assert (body["kind"], body["run_status"], body["interruption_reason"]) == (
        "interruption",
        "interrupted",
        "lease_expired",
    )
    assert body["dirty_reasons"] == ["unconfirmed_side_effects", "outbox_in_flight"]
    assert [entry["side_effect_state"] for entry in body["unconfirmed_side_effects"]] == [
        "pending_verification"
    ]
    assert body["in_flight_outbox_ids"] == [item.public_id]
    assert body["resolutions"] == []


def test_resolving_through_the_api_then_resuming(api, team, reviewer_token):
    run = interrupted(team)
    write = run.execution_records.get(side_effect="write").tool_call_id
    refused = api.post(url(run, "resume/"), {}, reviewer_token)
    assert refused.status_code == 409
    assert "resolve the interruption's unknowns" in refused.json()["detail"]
    resolved = api.post(
        url(run, "resolutions/"),
        {
            "target": "tool_call",
            "id": write,
            "decision": "not_applied",
            "evidence": "not in the deploy history",
        },
        reviewer_token,
    )
    assert resolved.status_code in (200, 201), resolved.json()
    body = api.get(url(run, "interruption-packet/"), reviewer_token).json()
    assert body["dirty_reasons"] == [] and len(body["resolutions"]) == 1
    assert api.post(url(run, "resume/"), {}, reviewer_token).status_code == 200


def test_the_stop_packet_of_an_interrupted_run_is_404_saying_so(api, team, reviewer_token):
    run = interrupted(team)
    response = api.get(url(run, "stop-packet/"), reviewer_token)
    assert response.status_code == 404
    detail = response.json()["detail"]
    assert "interrupted, not stopped" in detail and "interruption-packet/" in detail


def test_a_run_that_is_not_interrupted_has_no_interruption_packet(api, team, reviewer_token):
    run = new_run(team)
    response = api.get(url(run, "interruption-packet/"), reviewer_token)
    assert response.status_code == 404
    assert "is not interrupted (it is pending)" in response.json()["detail"]
