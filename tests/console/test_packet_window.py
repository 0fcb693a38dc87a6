"""The stop packet page lists the newest completed steps, tool calls and artifacts of a long packet
(every pending step, unknown and frozen or in-flight outbox item whatever its age), with "show
all"; its query count does not grow with the run. The JSON download and the API stay whole, and
the snapshot itself is pinned field by field."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

import console.selectors.packets as console_selectors
from handoff.packets import stop_packet_snapshot
from runs import frozen as frozen_by_stop
from runs import services
from runs.models import (
    Artifact,
    ExecutionRecord,
    Lease,
    OutboxItem,
    Run,
    SteeringMessage,
    Step,
    StopRequest,
    Team,
)
from tests.support.scenarios import AGENT, SYSTEM, new_run, reload, start

pytestmark = pytest.mark.django_db


def _long_packet(team: Team, *, completed: int, reads: int = 0, artifacts: int = 0) -> Run:
    """Stopped dirty through the services: `completed` steps done, two not done (one running, one
    planned), an old write whose outcome nobody knows, `reads` newer read calls, `artifacts`
    artifacts, one outbox item frozen by the stop and one in flight when it came."""
    keys = [f"step_{n:04d}" for n in range(completed + 2)]
    run = new_run(team, title="long", steps=tuple(keys))
    lease = start(run)
    services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="call_old_write",
        tool="deploy.push",
        actor=AGENT,
        side_effect="write",
        operation_id="deploy-1",
        recovery_policy="query_original",
    )
    events = []
    for key in keys[:completed]:
        events += [
            {"event_id": f"{key}-start", "type": "step.started", "key": key},
            {"event_id": f"{key}-done", "type": "step.completed", "key": key},
        ]
    events.append({"event_id": "last-start", "type": "step.started", "key": keys[completed]})
    events += [
        {"event_id": f"artifact-{n}", "type": "artifact.added", "name": f"artifact_{n:03d}.md"}
        for n in range(artifacts)
    ]
    for first in range(0, len(events), 500):
        services.events_ingest(
            run_id=run.pk, epoch=lease.epoch, events=events[first : first + 500], actor=AGENT
        )
    for n in range(reads):
        services.permit_request(
            run_id=run.pk,
            epoch=lease.epoch,
            tool_call_id=f"call_read_{n:03d}",
            tool="search",
            actor=AGENT,
        )
        services.tool_result_report(
            run_id=run.pk,
            tool_call_id=f"call_read_{n:03d}",
            execution_state="succeeded",
            actor=AGENT,
        )
    for n in range(2):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=lease.epoch,
            transport="email",
            destination="cfo@example.com",
            payload={"n": n},
            idempotency_key=f"mail-{n}",
            actor=AGENT,
        )
    services.outbox_claim(
        item_id=OutboxItem.objects.filter(run=run).order_by("pk").first().pk, dispatcher="d-1"
    )
    services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM)
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
    )
    run.refresh_from_db()
    assert run.status == "stopped_dirty"
    return run


def _packet_url(run: Run) -> str:
    return f"/runs/{run.pk}/packets/{run.stop_epoch}/"


def _section(body: str, section_id: str) -> str:
    start = body.index(f'<section id="{section_id}"')
    return body[start : body.index("</section>", start)]


@pytest.fixture
def long_run(team) -> Run:
    return _long_packet(team, completed=400)


def test_a_long_packet_shows_the_newest_completed_steps_and_every_pending_step_and_unknown(
    as_reviewer, long_run
):
    body = as_reviewer.get(_packet_url(long_run)).content.decode()
    done = _section(body, "packet-done")
    assert "Showing the newest 200 of 400 completed steps" in done
    assert 'href="?all=1#packet-done">show all</a>' in done
    assert "Step_0399" in done and "Step_0200" in done
    assert "Step_0199" not in done and "Step_0000" not in done
    assert done.count("<li>") == 200
    pending = _section(body, "packet-pending")
    assert "Step_0400" in pending and "Step_0401" in pending  # not done: never windowed
    # the unknowns and the outbox a reviewer must decide on are all there
    assert 'data-target-id="call_old_write"' in body and "Record resolution" in body
    # A stop freezes by epoch: every reader (the packet page here) sees the pending item frozen
    # from the commit; the row itself is relabelled later.
    in_flight, frozen = frozen_by_stop.present(
        reload(long_run), OutboxItem.objects.filter(run=long_run).order_by("pk")
    )
    assert f'data-target-id="{in_flight.public_id}"' in body
    assert frozen.status == "frozen" and f"/outbox/{frozen.pk}/release/" in _section(
        body, "packet-frozen"
    )
    # the raw JSON of a windowed page would be the whole packet again: the page points at it instead
    assert 'class="json"' not in body
    assert f"/runs/{long_run.pk}/packets/{long_run.stop_epoch}.json" in _section(
        body, "packet-json"
    )


def test_show_all_lists_every_completed_step(as_viewer, long_run):
    body = as_viewer.get(_packet_url(long_run), {"all": "1"}).content.decode()
    done = _section(body, "packet-done")
    assert "Showing the newest" not in body
    assert done.count("<li>") == 400 and "Step_0000" in done and "Step_0399" in done
    assert 'class="json"' in body and "Step_0000" in body.split('class="json"', 1)[1]


def test_a_short_packet_is_not_windowed(as_viewer, team):
    run = _long_packet(team, completed=10)
    body = as_viewer.get(_packet_url(run)).content.decode()
    assert "Showing the newest" not in body and "raw-json-omitted" not in body
    assert _section(body, "packet-done").count("<li>") == 10
    assert '<pre class="json">' in body


def test_packet_page_queries_do_not_grow_with_steps(as_reviewer, team):
    short = _long_packet(team, completed=10)
    long = _long_packet(team, completed=400)
    with CaptureQueriesContext(connection) as few:
        assert as_reviewer.get(_packet_url(short)).status_code == 200
    with CaptureQueriesContext(connection) as many:
        assert as_reviewer.get(_packet_url(long)).status_code == 200
    with CaptureQueriesContext(connection) as everything:
        assert as_reviewer.get(_packet_url(long), {"all": "1"}).status_code == 200
    assert len(few) == len(many) == len(everything)


def test_the_window_keeps_every_unconfirmed_call_and_the_newest_artifacts(
    as_viewer, team, monkeypatch
):
    monkeypatch.setattr(console_selectors, "PACKET_WINDOW", 3)
    run = _long_packet(team, completed=5, reads=6, artifacts=5)
    body = as_viewer.get(_packet_url(run)).content.decode()
    calls = _section(body, "packet-calls")
    assert "Showing the newest 4 of 7 tool calls, and every unconfirmed one" in calls
    assert "call_old_write" in calls  # the oldest call, but its outcome is unknown
    assert "call_read_005" in calls and "call_read_003" in calls and "call_read_002" not in calls
    artifacts = _section(body, "packet-artifacts")
    assert "Showing the newest 3 of 5 artifacts" in artifacts
    assert (
        "artifact_004.md" in artifacts
        and "artifact_002.md" in artifacts
        and "artifact_001.md" not in artifacts
    )
    assert "Showing the newest 3 of 5 completed steps" in body
    everything = as_viewer.get(_packet_url(run), {"all": "1"}).content.decode()
    assert (
        "call_read_000" in everything
        and "artifact_000.md" in everything
        and "Step_0000" in everything
    )


def test_json_download_and_api_stay_the_whole_packet(as_viewer, long_run, reviewer_token):
    stored = long_run.stop_packets.get().snapshot
    assert len(stored["completed_steps"]) == 400
    download = json.loads(
        as_viewer.get(f"/runs/{long_run.pk}/packets/{long_run.stop_epoch}.json").content
    )
    assert download == stored
    api = Client().get(f"/api/v1/runs/{long_run.pk}/stop-packet/", **reviewer_token.header).json()
    assert (
        api["completed_steps"] == stored["completed_steps"] and len(api["completed_steps"]) == 400
    )


# --------------------------------------------------------------------------------------------
# the snapshot itself: the same keys, values and order as DESIGN §4 and every packet stored so far


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def test_stop_packet_snapshot_is_exactly_the_stop_state(team, bob):
    """Steps done, running and planned, one reported while draining; a read and an unknown write;
    an artifact; outbox sent, in flight and frozen; a steering message left unapplied."""
    run = new_run(team, steps=("plan", "search", "draft", "notify"))
    lease = start(run)
    epoch = lease.epoch
    services.events_ingest(
        run_id=run.pk,
        epoch=epoch,
        actor=AGENT,
        events=[
            {"event_id": "e1", "type": "step.started", "key": "plan", "kind": "tool_read"},
            {"event_id": "e2", "type": "step.completed", "key": "plan"},
            {
                "event_id": "e3",
                "type": "step.started",
                "key": "search",
                "name": "Search the archive",
            },
            {"event_id": "e4", "type": "step.completed", "key": "search"},
            {"event_id": "e5", "type": "step.started", "key": "draft"},
            {
                "event_id": "e6",
                "type": "artifact.added",
                "name": "draft.md",
                "kind": "markdown",
                "uri": "s3://b/draft.md",
                "checksum": "sha256:ab",
                "reusable": True,
                "content": "# Draft",
            },
        ],
    )
    services.permit_request(
        run_id=run.pk,
        epoch=epoch,
        tool_call_id="call_read",
        tool="web.search",
        actor=AGENT,
        step_key="search",
    )
    services.tool_result_report(
        run_id=run.pk,
        tool_call_id="call_read",
        execution_state="succeeded",
        actor=AGENT,
        observation="12 results",
    )
    services.permit_request(
        run_id=run.pk,
        epoch=epoch,
        tool_call_id="call_deploy",
        tool="deploy.push",
        actor=AGENT,
        side_effect="write",
        operation_id="deploy-7",
        idempotency_key="deploy-key-7",
        recovery_policy="query_original",
        step_key="draft",
    )
    for n in range(3):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=epoch,
            transport="email",
            destination="cfo@example.com",
            payload={"n": n},
            idempotency_key=f"mail-{n}",
            actor=AGENT,
        )
    sent, in_flight, frozen = OutboxItem.objects.filter(run=run).order_by("pk")
    services.outbox_claim(item_id=sent.pk, dispatcher="d-1")
    services.outbox_record_outcome(
        item_id=sent.pk, outcome="sent", dispatcher="d-1", response_status=250
    )
    services.outbox_claim(item_id=in_flight.pk, dispatcher="d-1")
    steering = services.steering_queue(run_id=run.pk, text="Use the Q3 numbers", actor=AGENT)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=SYSTEM, note="looks wrong")
    services.events_ingest(
        run_id=run.pk,
        epoch=epoch,
        actor=AGENT,
        events=[
            {"event_id": "e7", "type": "step.completed", "key": "draft"},  # reported while draining
        ],
    )
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=epoch, actor=AGENT, observations=[]
    )
    services.outbox_relabel_frozen(run_id=run.pk)  # the rows as every reader already saw them
    run.refresh_from_db()
    stop_request = StopRequest.objects.get(run=run, epoch_after=run.stop_epoch)
    lease = Lease.objects.get(pk=lease.pk)
    steps = {step.key: step for step in Step.objects.filter(run=run)}
    calls = {call.tool_call_id: call for call in ExecutionRecord.objects.filter(run=run)}
    sent, in_flight, frozen = OutboxItem.objects.filter(run=run).order_by("pk")
    artifact = Artifact.objects.get(run=run)
    steering = SteeringMessage.objects.get(pk=steering.pk)
    deploy = {
        "tool_call_id": "call_deploy",
        "tool": "deploy.push",
        "operation_id": "deploy-7",
        "side_effect": "write",
        "execution_state": "unknown",
        "side_effect_state": "pending_verification",
        "remote_cancel_state": "requested",
        "cancel_requested": True,
        "last_observation": "",  # asked by the stop
        "last_observed_at": _iso(calls["call_deploy"].observed_at),
        "observation_source": "stop",
        "output_truncated": False,
        "recovery_policy": "query_original",
        "recovery_action": "query deploy-7; do not re-run deploy.push",
        "idempotency_key": "deploy-key-7",
        "permit_epoch": epoch,
        "reported_after_stop": False,
    }

    def outbox(item: OutboxItem, status: str) -> dict:
        return {
            "id": item.public_id,
            "transport": "email",
            "destination": "cfo@example.com",
            "status": status,
            "idempotency_key": item.idempotency_key,
            "claimed_at": _iso(item.claimed_at),
            "frozen_at": _iso(item.frozen_at),
        }

    expected = {
        "run_id": run.pk,
        "title": "Quarterly report",
        "agent": "report-bot",
        "team": "acme",
        "stop_epoch": run.stop_epoch,
        "stop_reason": "user_stop",
        "stop_note": "looks wrong",
        "takeover": False,
        "requested_by": stop_request.requested_by,
        "requested_at": _iso(stop_request.requested_at),
        "acknowledged_at": _iso(stop_request.acknowledged_at),
        "drained_at": _iso(stop_request.drained_at),
        "stopped_at": _iso(stop_request.stopped_at),
        "state": "stopped_dirty",
        "dirty_reasons": list(stop_request.dirty_reasons),
        "lease_released": True,
        "leases": [
            {
                "lease_id": lease.token,
                "worker_id": "worker-1",
                "epoch": epoch,
                "release_reason": "released",
                "released_at": _iso(lease.released_at),
                "fenced_unconfirmed": False,
            }
        ],
        "resume_from": None,
        "frozen_outbox_ids": [frozen.public_id],
        "in_flight_outbox_ids": [in_flight.public_id],
        "outbox": [
            outbox(sent, "sent"),
            outbox(in_flight, "dispatching"),
            outbox(frozen, "frozen"),
        ],
        "completed_steps": [
            {
                "seq": 1,
                "key": "plan",
                "name": "Plan",
                "finished_at": _iso(steps["plan"].finished_at),
                "reported_after_stop": False,
            },
            {
                "seq": 2,
                "key": "search",
                "name": "Search the archive",
                "finished_at": _iso(steps["search"].finished_at),
                "reported_after_stop": False,
            },
            {
                "seq": 3,
                "key": "draft",
                "name": "Draft",
                "finished_at": _iso(steps["draft"].finished_at),
                "reported_after_stop": True,
            },
        ],
        "pending_steps": [{"seq": 4, "key": "notify", "name": "Notify", "status": "planned"}],
        "artifacts": [
            {
                "id": artifact.pk,
                "name": "draft.md",
                "kind": "markdown",
                "uri": "s3://b/draft.md",
                "checksum": "sha256:ab",
                "reusable": True,
                "evidence": False,
            }
        ],
        "tool_calls": [
            {
                "tool_call_id": "call_read",
                "tool": "web.search",
                "operation_id": None,
                "side_effect": "none",
                "execution_state": "succeeded",
                "side_effect_state": "none",
                "remote_cancel_state": "not_requested",
                "cancel_requested": False,
                "last_observation": "12 results",
                "last_observed_at": _iso(calls["call_read"].observed_at),
                "observation_source": "worker",
                "output_truncated": False,
                "recovery_policy": "manual_confirmation",
                "recovery_action": "",
                "idempotency_key": None,
                "permit_epoch": epoch,
                "reported_after_stop": False,
            },
            deploy,
        ],
        "unconfirmed_side_effects": [deploy],
        "unapplied_steering": [
            {"id": steering.pk, "text": "Use the Q3 numbers", "author": "agent-1"}
        ],
        "approvals_void_at_stop": [],
        "reported_after_stop": [],
        "late_writes_rejected": 0,
        "cost": {
            "cost_usd_until_stop": 0.0,
            "tokens_until_stop": 0,
            "unpriced_tokens_until_stop": 0,
            "late_cost_usd": 0.0,
            "late_tokens": 0,
            "late_unpriced_tokens": 0,
            "by_model": [],
            "budget": None,
        },
    }
    assert stop_request.stopped_at is not None and calls["call_deploy"].observed_at is not None
    stored = run.stop_packets.get().snapshot
    rebuilt = stop_packet_snapshot(run, stop_request)
    assert rebuilt == expected
    # same keys in the same order, nested too: the JSON text is identical
    assert json.dumps(rebuilt) == json.dumps(expected)
    assert stored == expected
