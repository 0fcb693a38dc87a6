"""Seed 001 §6 rows 11, 13, 14, and the other seeds' failure cases.

- row 11: repeated stop clicks; row 13: a new round right after the stop; row 14: steering
  then an immediate stop — against a live server, through HTTP and `safestop_agent`;
- seed 000 §8: a stop while the dispatcher is scanning — the message is not sent;
- seed 004: a client disconnecting is not a stop; a completion arriving with the stop.

Assertions are on StopRequests, epochs, the ledger, steering rows, outbox rows and receiver
receipts, leases and stop packets.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client
from websockets.sync.client import connect

from handoff.models import Handoff, Resolution, StopPacket
from runs import dispatch, services
from runs.actors import Actor
from runs.errors import StaleEpoch
from runs.models import (
    ExecutionRecord,
    Lease,
    LedgerEntry,
    OutboxItem,
    OutboxStatus,
    Run,
    RunStatus,
    SideEffectState,
    SteeringMessage,
    SteeringStatus,
    Step,
    StopRequest,
)
from safestop_agent import AgentRun, Refused
from tests.support.run_factories import run_complete
from tests.support.scenarios import make_running, outbox_seen
from tests.support.stack import WorkerThread, actions, leased, planned, racer, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

AGENT = Actor.system("agent")
REVIEWER = Actor.system("reviewer")


def _together(count: int, fn: Any) -> list[Any]:
    """Call `fn()` from `count` threads released at the same instant; return the answers."""
    barrier = threading.Barrier(count)
    answers: list[Any] = [None] * count

    def body(index: int) -> None:
        barrier.wait(10)
        try:
            answers[index] = fn()
        except Exception as error:
            answers[index] = error

    threads = [threading.Thread(target=body, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_repeated_stop_clicks_do_not_duplicate_results_or_compensation(stack):
    """Row 11 (连点停止按钮): one stop, one packet, one result per call, one compensation."""
    client = stack.agent()
    run_id = client.create_run(
        "Charge invoice 88", "fault-bot", steps=planned(("charge", "tool_write"))
    )["id"]
    charging = threading.Event()

    def work() -> None:
        with leased(client, run_id) as run:
            with run.step("charge", "Charge the card", kind="tool_write"):
                with run.tool_call(
                    "charge_card",
                    {"invoice": 88},
                    side_effect="write",
                    tool_call_id="call_charge",
                    idempotency_key="charge-88",
                    operation_id="ch_88",
                    recovery_policy="compensate",
                ):
                    charging.set()
                    run.token.wait(10)
                    run.token.raise_if_cancelled()

    worker = WorkerThread(work)
    worker.start()
    assert charging.wait(10)
    headers = {"Authorization": f"Bearer {stack.reviewer_raw}"}

    def click(path: str, body: dict[str, Any]) -> httpx.Response:
        with httpx.Client(base_url=stack.url, headers=headers, timeout=20, trust_env=False) as http:
            return http.post(f"/api/v1/runs/{run_id}/{path}", json=body)

    answers = _together(20, lambda: click("cancel/", {"reason": "user_stop", "note": "stop!"}))
    assert all(isinstance(a, httpx.Response) and a.status_code == 202 for a in answers), answers
    assert len({a.json()["stop_request"]["id"] for a in answers}) == 1
    worker.outcome()
    run = wait_status(run_id, RunStatus.STOPPED_DIRTY)
    assert run.stop_epoch == 2 and StopRequest.objects.filter(run_id=run_id).count() == 1
    assert StopPacket.objects.filter(run_id=run_id).count() == 1
    log = Counter(actions(run_id))
    assert log["run.stop_requested"] == 1 and log["run.stopped_dirty"] == 1
    assert log["tool.result"] == 1  # the call's result was filled in once, not once per click

    answers = _together(
        10,
        lambda: click(
            "resolutions/",
            {
                "target": "tool_call",
                "id": "call_charge",
                "decision": "compensated",
                "evidence": "refund re_88 issued for ch_88",
            },
        ),
    )
    assert all(isinstance(a, httpx.Response) and a.status_code in (200, 201) for a in answers), (
        answers
    )
    assert Resolution.objects.filter(run_id=run_id).count() == 1
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_charge")
    assert record.side_effect_state == SideEffectState.COMPENSATED and record.resolved
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)

    answers = _together(10, lambda: click("takeover/", {"note": "I'll finish it"}))
    assert all(isinstance(a, httpx.Response) and a.status_code < 300 for a in answers), answers
    wait_status(run_id, RunStatus.HANDED_OFF)
    assert Handoff.objects.filter(run_id=run_id).count() == 1
    log = Counter(actions(run_id))
    assert (log["resolution.recorded"], log["run.stopped_cleanly"], log["run.handed_off"]) == (
        1,
        1,
        1,
    )
    assert StopRequest.objects.filter(run_id=run_id).count() == 1


def test_new_round_right_after_cancel_is_isolated_from_the_old_rounds_callbacks(stack):
    """Row 13 (取消后立即开始新一轮): the old round's callbacks cannot change the new one."""
    old, new, reviewer = stack.agent(), stack.agent(), stack.reviewer()
    run_id = old.create_run("Reindex catalog", "fault-bot", steps=planned(("index", "tool_read")))[
        "id"
    ]
    # the old worker (raw client: we control exactly when its callbacks arrive)
    lease = old.acquire_lease(run_id, "worker-old", ttl_seconds=30)
    old.send_events(
        run_id,
        epoch=1,
        events=[
            {
                "event_id": "old-1",
                "type": "step.started",
                "key": "index",
                "name": "Index",
                "kind": "tool_read",
            }
        ],
    )
    old.request_permit(
        run_id, epoch=1, tool_call_id="call_old", tool="reindex", side_effect="none", arguments={}
    )
    reviewer.cancel(run_id, "user_stop", note="wrong catalog; restart")
    old.drained(run_id, lease_id=lease["lease_id"], epoch=1, observations=[])
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    reviewer.resume(run_id)  # at once: the new round starts while the old worker still runs

    runs: list[AgentRun] = []
    in_new_round = threading.Event()
    old_done = threading.Event()

    def new_round() -> None:
        with leased(new, run_id, worker_id="worker-new", into=runs) as run:
            with run.step("index", "Index (new round)", kind="tool_read"):
                with run.tool_call(
                    "reindex", {"catalog": "right"}, tool_call_id="call_new"
                ) as call:
                    in_new_round.set()
                    assert old_done.wait(15)
                    call.result = "indexed 1200 items"
            run.checkpoint("checkpoint_new", {"items": 1200})
            run.complete({"round": "new"})

    worker = WorkerThread(new_round)
    worker.start()
    assert in_new_round.wait(10)
    before = Run.objects.get(pk=run_id)
    assert (before.status, before.stop_epoch) == (RunStatus.RUNNING, 3)

    # the old worker's late callbacks, all at its epoch 1
    old.report_tool_result(
        run_id, "call_old", execution_state="succeeded", observation="old index done"
    )
    answers = old.send_events(
        run_id,
        epoch=1,
        events=[
            {"event_id": "old-2", "type": "step.completed", "key": "index"},
            {
                "event_id": "old-3",
                "type": "checkpoint.saved",
                "label": "checkpoint_old",
                "state": {},
            },
            {
                "event_id": "old-4",
                "type": "step.started",
                "key": "publish",
                "name": "Publish",
                "kind": "tool_write",
            },
            {"event_id": "old-5", "type": "run.completed", "result": {"round": "old"}},
        ],
    )
    verdicts = {a["event_id"]: (a["status"], a.get("code")) for a in answers["results"]}
    refusals = []
    for call in (
        lambda: old.request_permit(
            run_id,
            epoch=1,
            tool_call_id="call_old_2",
            tool="publish",
            side_effect="write",
            arguments={},
        ),
        lambda: old.enqueue_outbox(
            run_id,
            epoch=1,
            transport="webhook",
            destination=stack.receiver.url("/hooks/x"),
            payload={},
            idempotency_key="old-outbox",
        ),
        lambda: old.heartbeat(run_id, lease_id=lease["lease_id"], epoch=1),
    ):
        with pytest.raises(Refused) as refused:
            call()
        refusals.append(refused.value.code)
    old_done.set()
    worker.outcome()

    assert verdicts == {
        "old-2": ("rejected", "stale_epoch"),  # the step now belongs to the new round
        "old-3": ("accepted", None),  # kept as a fact, but it does not move resume_from
        "old-4": ("rejected", "stale_epoch"),
        "old-5": ("rejected", "stale_epoch"),
    }
    assert refusals == ["stale_epoch", "stale_epoch", "lease_revoked"]
    final = wait_status(run_id, RunStatus.COMPLETED)
    assert final.result == {"round": "new"} and final.resume_from == "checkpoint_new"
    assert [report["result"] for report in final.late_reports] == [{"round": "old"}]
    step = Step.objects.get(run_id=run_id, key="index")
    assert (step.epoch, step.status, step.reported_after_stop) == (3, "completed", False)
    assert not Step.objects.filter(run_id=run_id, key="publish").exists()
    records = {r.tool_call_id: r for r in ExecutionRecord.objects.filter(run_id=run_id)}
    assert set(records) == {"call_old", "call_new"}
    assert (records["call_new"].permit_epoch, records["call_new"].last_observation) == (
        3,
        "indexed 1200 items",
    )
    assert records["call_old"].reported_after_stop and records["call_old"].permit_epoch == 1
    assert not OutboxItem.objects.filter(run_id=run_id).exists()
    assert final.late_writes_rejected >= 5
    assert not runs[0].token.cancelled  # no signal of the old round reached the new worker


def test_steering_then_immediate_cancel_is_not_a_reason_to_continue(stack):
    """Row 14 (Steering 后紧接着取消): the unapplied message is kept, marked, and never used to
    continue; the human decides whether the next round gets it."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Draft the release notes",
        "fault-bot",
        steps=planned(("draft", "model_call"), ("revise", "model_call")),
    )["id"]
    inbox: list[int] = []
    drafting = threading.Event()
    attempts: dict[str, Any] = {}

    def work() -> None:
        with leased(client, run_id) as run:
            with run.step("draft", "Draft", kind="model_call"):
                drafting.set()
                assert run.token.wait(10)  # the model call finishes as the stop lands
            # A careless agent that treats the new message as a reason to go on: the server
            # must refuse it anyway.
            attempts["applied"] = run.steering_applied(inbox[0])
            attempts["step"] = run.event(
                "step.started", key="revise", name="Revise per steering", kind="model_call"
            )
            run.token.raise_if_cancelled()

    worker = WorkerThread(work)
    worker.start()
    assert drafting.wait(10)
    inbox.append(reviewer.steer(run_id, "Mention the EU data residency change first.")["id"])
    reviewer.cancel(run_id, "user_stop", note="hold the notes")
    worker.outcome()

    run = wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    assert attempts["applied"]["status"] == "rejected" and attempts["step"]["status"] == "rejected"
    message = SteeringMessage.objects.get(pk=inbox[0])
    assert (message.status, message.applied_at) == (SteeringStatus.UNAPPLIED_AT_STOP, None)
    stop_at = run.stop_requested_at
    assert not Step.objects.filter(run_id=run_id, started_at__gt=stop_at).exists()
    assert not Step.objects.filter(run_id=run_id, key="revise").exclude(status="planned").exists()
    packet = StopPacket.objects.get(run_id=run_id, stop_epoch=run.stop_epoch).snapshot
    assert packet["unapplied_steering"] == [
        {
            "id": message.pk,
            "text": "Mention the EU data residency change first.",
            "author": "reviewer-bot",
        }
    ]

    # the reviewer decides to carry it over: only the next round may apply it
    reviewer.resume(run_id, carry_over_steering=True)
    assert SteeringMessage.objects.get(pk=message.pk).status == SteeringStatus.CARRIED_OVER
    with leased(client, run_id, worker_id="worker-2") as run2:
        assert run2.steering_applied(message.pk)["status"] == "accepted"
        run2.complete({"notes": "drafted with the EU change first"})
    assert SteeringMessage.objects.get(pk=message.pk).status == SteeringStatus.APPLIED
    wait_status(run_id, RunStatus.COMPLETED)


# --------------------------------------------------------------------------------------------
# seed 000 §8 and seed 004


def test_stop_while_the_dispatcher_is_scanning_sends_nothing(transactional_db, team, receiver):
    """Seed 000 §8 (用户点了停止，但消息还是发出去了): the dispatcher read the old state; the
    message must still not go out, and the stop is recorded and ledgered."""
    run, lease = make_running(team)
    for n in range(5):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=1,
            transport="webhook",
            destination=receiver.url("/hooks/notify"),
            payload={"message": n},
            idempotency_key=f"notify-{n}",
            actor=AGENT,
        )
    scanned, stop_committed = threading.Event(), threading.Event()
    claimed: list[Any] = []

    def dispatcher() -> None:
        try:
            # the dispatcher's scan, as `outbox_claim_next` reads it: pending items of running runs
            candidates = list(
                OutboxItem.objects.filter(
                    status=OutboxStatus.PENDING, run__status=RunStatus.RUNNING
                )
                .order_by("created_at")
                .values_list("pk", flat=True)
            )
            assert len(candidates) == 5
            scanned.set()
            assert stop_committed.wait(10)  # the user presses Stop while the scan result is in hand
            claimed.extend(dispatch.dispatch_one(pk) for pk in candidates)
        finally:
            connection.close()

    thread = threading.Thread(target=dispatcher)
    thread.start()
    assert scanned.wait(10)
    outcome = services.run_stop(
        run_id=run.pk, reason="user_stop", actor=REVIEWER, note="do not send"
    )
    stop_committed.set()
    thread.join(20)

    assert claimed == [None] * 5
    time.sleep(0.2)
    assert receiver.count() == 0
    items = outbox_seen(run)
    assert {(item.status, item.frozen_by_epoch, item.claim_epoch) for item in items} == {
        (OutboxStatus.FROZEN, 2, None)
    }
    # the stop is a recorded, ledgered transition, not a dropped request
    assert outcome.created and StopRequest.objects.filter(run=run).count() == 1
    log = actions(run.pk)
    assert "run.stop_requested" in log and "outbox.claimed" not in log
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=1, actor=AGENT)
    final = wait_status(run.pk, RunStatus.STOPPED_CLEANLY)
    packet = StopPacket.objects.get(run=run, stop_epoch=final.stop_epoch).snapshot
    assert sorted(packet["frozen_outbox_ids"]) == sorted(item.public_id for item in items)
    assert packet["in_flight_outbox_ids"] == []


def test_stop_racing_a_busy_dispatcher_never_sends_after_the_stop(transactional_db, team, receiver):
    """Seed 000 §8 under real concurrency: every message that went out was claimed before the
    stop committed; every other one is frozen; nothing is sent twice."""
    sent_total = 0
    for attempt in range(8):
        run, _lease = make_running(team)
        for n in range(6):
            services.outbox_enqueue(
                run_id=run.pk,
                epoch=1,
                transport="webhook",
                destination=receiver.url("/hooks/race"),
                payload={"n": n},
                idempotency_key=f"race-{attempt}-{n}",
                actor=AGENT,
            )
        barrier: threading.Barrier = threading.Barrier(2)
        thread = racer(barrier, lambda: dispatch.dispatch_pending(limit=10), {}, "dispatcher")
        thread.start()
        barrier.wait(10)
        time.sleep(0.002 * attempt)  # slide the stop across the dispatcher's work
        services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
        thread.join(30)
        entries = list(
            LedgerEntry.objects.filter(run=run).order_by("run_seq").values_list("action", "payload")
        )
        stop_at = next(i for i, (action, _) in enumerate(entries) if action == "run.stop_requested")
        claimed_before = {
            payload["outbox_id"]
            for action, payload in entries[:stop_at]
            if action == "outbox.claimed"
        }
        claimed_after = {
            payload["outbox_id"]
            for action, payload in entries[stop_at:]
            if action == "outbox.claimed"
        }
        assert claimed_after == set()
        items = {item.public_id: item for item in outbox_seen(run)}
        assert {
            pid for pid, item in items.items() if item.status == OutboxStatus.SENT
        } == claimed_before
        assert all(
            item.status == OutboxStatus.FROZEN
            for pid, item in items.items()
            if pid not in claimed_before
        )
        sent_total += len(claimed_before)
    assert receiver.count() == sent_total and receiver.duplicates() == {}


def test_client_disconnecting_is_not_a_stop(stack, bob):
    """Seed 004 (客户端断开不是停止): agent and browser connections that drop leave the run
    running, with no StopRequest, and the worker carries on."""
    client = stack.agent()
    run_id = client.create_run("Nightly sync", "fault-bot", steps=planned(("sync", "tool_read")))[
        "id"
    ]
    browser = Client()
    browser.force_login(bob)
    session = browser.cookies["sessionid"].value
    host = stack.url.split("//", 1)[1]

    with leased(client, run_id) as run:
        # 1. the worker's own push socket dies (network blip), and a second agent socket is
        #    cut without a close frame
        run._listener.stop(timeout=2)
        extra = connect(
            stack.live.agent_ws_url(run_id),
            additional_headers={"Authorization": f"Bearer {stack.agent_raw}"},
        )
        extra.socket.shutdown(socket.SHUT_RDWR)
        extra.socket.close()
        # 2. a reviewer's tab on the run page: its websocket and an HTTP request, then the tab closes
        tab = connect(
            f"{stack.live.ws_url}/ws/runs/{run_id}/",
            origin=stack.url,
            additional_headers={"Cookie": f"sessionid={session}"},
        )
        tab.socket.shutdown(socket.SHUT_RDWR)
        tab.socket.close()
        with socket.create_connection(("127.0.0.1", stack.live.port)) as raw:
            raw.sendall(
                f"GET /runs/{run_id}/ HTTP/1.1\r\nHost: {host}\r\nCookie: sessionid={session}\r\n\r\n".encode()
            )
        # 3. an API client that drops in the middle of sending a stop: no complete request, no stop
        with socket.create_connection(("127.0.0.1", stack.live.port)) as raw:
            raw.sendall(
                (
                    f"POST /api/v1/runs/{run_id}/cancel/ HTTP/1.1\r\nHost: {host}\r\n"
                    f"Authorization: Bearer {stack.reviewer_raw}\r\nContent-Type: application/json\r\n"
                    'Content-Length: 64\r\n\r\n{"reason": "user_'
                ).encode()
            )
        time.sleep(1.0)  # ten background ticks: reapers and watchdogs had their chance

        assert Run.objects.get(pk=run_id).status == RunStatus.RUNNING
        assert not StopRequest.objects.filter(run_id=run_id).exists()
        assert not [
            a for a in actions(run_id) if a.startswith(("run.stop", "stop.", "run.interrupted"))
        ]
        assert Lease.objects.get(run_id=run_id, released_at__isnull=True).worker_id == "worker-1"
        assert not run.token.cancelled
        # the worker carries on: heartbeats renew, permits are granted, it finishes
        assert run._beat()["signal"] is None
        with run.step("sync", "Sync", kind="tool_read"):
            with run.tool_call("sync_rows", {"table": "orders"}) as call:
                call.result = "synced 310 rows"
        run.complete({"rows": 310})
    final = wait_status(run_id, RunStatus.COMPLETED)
    assert final.result == {"rows": 310} and final.stop_epoch == 1


def test_completion_arriving_with_the_stop(transactional_db, team):
    """Seed 004 / DESIGN §2: a completion recorded first wins and the stop is answered "already
    completed"; a completion after the stop is kept as a fact and moves nothing."""
    seen: Counter[str] = Counter()
    for attempt in range(12):
        run, lease = make_running(team)
        barrier, results = threading.Barrier(2), {}
        late_complete, late_stop = {0: (0.0, 0.02), 1: (0.02, 0.0), 2: (0.0, 0.0)}[attempt % 3]

        threads = [
            racer(
                barrier,
                lambda run_id=run.pk, n=attempt: run_complete(
                    run_id=run_id, epoch=1, actor=AGENT, result={"report": n}
                ),
                results,
                "complete",
                late_complete,
            ),
            racer(
                barrier,
                lambda run_id=run.pk: services.run_stop(
                    run_id=run_id, reason="user_stop", actor=REVIEWER
                ),
                results,
                "stop",
                late_stop,
            ),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        stop = results["stop"]
        assert isinstance(stop, services.StopOutcome), results
        current = Run.objects.get(pk=run.pk)
        if current.status == RunStatus.COMPLETED:
            seen["completed first"] += 1
            assert stop.already_finished and stop.stop_request is None
            assert current.result == {"report": attempt} and current.stop_epoch == 1
            assert not StopRequest.objects.filter(run=run).exists()
            ignored = LedgerEntry.objects.get(run=run, action="stop.ignored")
            assert ignored.payload["why"] == "already finished"
        else:
            seen["stop first"] += 1
            assert isinstance(results["complete"], StaleEpoch)
            assert current.status == RunStatus.CANCEL_REQUESTED and current.result is None
            assert [
                (r["type"], r["result"], r["reported_after_stop"]) for r in current.late_reports
            ] == [("run.completed", {"report": attempt}, True)]
            services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=1, actor=AGENT)
            stopped = wait_status(run.pk, RunStatus.STOPPED_CLEANLY)
            packet = StopPacket.objects.get(run=run, stop_epoch=stopped.stop_epoch).snapshot
            assert packet["reported_after_stop"][0]["result"] == {"report": attempt}
            # a reviewer closes it: the late completion still does not become the run's result
            services.run_close(run_id=run.pk, actor=REVIEWER, note="not needed")
            closed = Run.objects.get(pk=run.pk)
            assert closed.status == RunStatus.CANCELLED and closed.result is None
            assert len(closed.late_reports) == 1
    print(f"\ncompletion/stop race over 12 runs: {dict(seen)}")
    assert set(seen) == {"completed first", "stop first"}
