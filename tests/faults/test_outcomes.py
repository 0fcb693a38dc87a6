"""Seed 001 §6, rows 8-10 and 12: what happened is recorded per call, and never guessed.

Rows 8, 10 and 12 drive `safestop_agent` (threads, a killed worker process) against a live
server and the demo webhook receiver; row 9 races the success and the stop on PostgreSQL rows
with real threads. Assertions are on execution records, outbox rows, receiver receipts (the
business effect), the ledger and the stop packet.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from handoff.models import StopPacket
from runs import dispatch, services
from runs.actors import Actor
from runs.errors import StaleEpoch
from runs.models import (
    ExecutionRecord,
    ExecutionState,
    LedgerEntry,
    OutboxItem,
    OutboxStatus,
    RemoteCancelState,
    RunStatus,
    SideEffectState,
)
from safestop_agent import AgentRun, ApiError, Cancelled
from tests.support.scenarios import make_running, outbox_seen
from tests.support.stack import (
    WorkerThread,
    actions,
    leased,
    planned,
    racer,
    wait_status,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
AGENT = Actor.system("agent")
REVIEWER = Actor.system("reviewer")


def test_parallel_tools_some_succeed_some_cancelled_each_keeps_its_own_result(stack):
    """Row 8 (并行工具中有的成功、有的取消): each call keeps its own result and ids."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Refund order 1187", "fault-bot", steps=planned(("fanout", "tool_read"))
    )["id"]
    a_done, b_running, c_running = threading.Event(), threading.Event(), threading.Event()
    d_ran: list[str] = []
    errors: dict[str, BaseException | None] = {}
    runs: list[AgentRun] = []

    def work() -> None:
        with leased(client, run_id, into=runs) as run:

            def lookup() -> None:  # fast read: done before the stop
                with run.tool_call(
                    "lookup_customer", {"order": 1187}, tool_call_id="call_a"
                ) as call:
                    call.result = {"customer": "cus_42"}
                a_done.set()

            def scan() -> None:  # slow read: interrupted
                with run.tool_call(
                    "scan_invoices", {"customer": "cus_42"}, tool_call_id="call_b"
                ) as call:
                    call.observe("scanned 3 of 12 invoices")
                    b_running.set()
                    run.token.wait(10)
                    run.token.raise_if_cancelled()

            def refund() -> None:  # write in flight: the remote got it; its cancel is unconfirmed
                with run.tool_call(
                    "issue_refund",
                    {"amount": 1200},
                    side_effect="write",
                    tool_call_id="call_c",
                    idempotency_key="refund-1187",
                    recovery_policy="query_original",
                ) as call:
                    call.set_operation_id("refund-77")
                    c_running.set()
                    run.token.wait(10)
                    call.set_remote_cancel_state("requested")
                    call.observe("refund submitted to the PSP; cancel requested, not confirmed")
                    run.token.raise_if_cancelled()

            def email() -> None:  # queued behind the others: starts only after the stop
                run.token.wait(10)
                with run.tool_call(
                    "email_customer",
                    {"template": "refund"},
                    side_effect="write",
                    tool_call_id="call_d",
                    idempotency_key="email-1187",
                ):
                    d_ran.append("call_d")

            with run.step("fanout", "Run the model's parallel tool calls", kind="tool_read"):
                with ThreadPoolExecutor(4) as pool:
                    futures = {
                        name: pool.submit(fn)
                        for name, fn in (("a", lookup), ("b", scan), ("c", refund), ("d", email))
                    }
                errors.update({name: future.exception() for name, future in futures.items()})
                run.token.raise_if_cancelled()

    worker = WorkerThread(work)
    worker.start()
    assert a_done.wait(10) and b_running.wait(10) and c_running.wait(10)
    reviewer.cancel(run_id, "user_stop", note="customer called: hold the refund")
    worker.outcome()

    # the worker: a finished, b and c were interrupted, d never started
    assert errors["a"] is None and d_ran == []
    assert all(isinstance(errors[name], Cancelled) for name in "bcd")
    run = wait_status(run_id, RunStatus.STOPPED_DIRTY)
    records = {r.tool_call_id: r for r in ExecutionRecord.objects.filter(run_id=run_id)}
    assert set(records) == {"call_a", "call_b", "call_c"}
    a, b, c = records["call_a"], records["call_b"], records["call_c"]
    assert (a.execution_state, a.cancel_requested) == (ExecutionState.SUCCEEDED, False)
    assert "cus_42" in a.last_observation
    assert (b.execution_state, b.cancel_requested) == (ExecutionState.FAILED, True)
    assert "scanned 3 of 12" in b.last_observation and "interrupted by stop" in b.last_observation
    assert (c.execution_state, c.side_effect_state) == (
        ExecutionState.UNKNOWN,
        SideEffectState.PENDING_VERIFICATION,
    )
    assert (c.operation_id, c.idempotency_key, c.remote_cancel_state) == (
        "refund-77",
        "refund-1187",
        RemoteCancelState.REQUESTED,
    )
    assert c.cancel_requested and c.reported_after_stop
    # one result per call in the ledger, each naming its own call
    reported = Counter(
        entry.payload["tool_call_id"]
        for entry in LedgerEntry.objects.filter(run_id=run_id, action="tool.result")
    )
    assert reported == Counter({"call_a": 1, "call_b": 1, "call_c": 1})
    packet = StopPacket.objects.get(run_id=run_id, stop_epoch=run.stop_epoch).snapshot
    assert {call["tool_call_id"]: call["execution_state"] for call in packet["tool_calls"]} == {
        "call_a": "succeeded",
        "call_b": "failed",
        "call_c": "unknown",
    }
    assert [u["tool_call_id"] for u in packet["unconfirmed_side_effects"]] == ["call_c"]


def test_tool_success_racing_the_stop_keeps_the_success_and_dispatches_nothing_more(
    transactional_db, team, receiver
):
    """Row 9 (工具成功与取消同时发生): a verifiable success is never overwritten, and nothing
    after it is dispatched — whichever of the two commits first."""
    orders: Counter[str] = Counter()
    for attempt in range(12):
        run, lease = make_running(team)
        services.permit_request(
            run_id=run.pk,
            epoch=1,
            tool_call_id="call_charge",
            tool="charge_card",
            side_effect="write",
            idempotency_key=f"charge-{attempt}",
            actor=AGENT,
        )
        # follow-up work already queued: the receipt email for the charge
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=1,
            transport="webhook",
            destination=receiver.url("/hooks/receipts"),
            payload={"charge": attempt},
            idempotency_key=f"receipt-{attempt}",
            actor=AGENT,
        )
        barrier, results = threading.Barrier(2), {}
        # A third of the runs let the success go first, a third the stop, a third a true race.
        late_success, late_stop = {0: (0.0, 0.02), 1: (0.02, 0.0), 2: (0.0, 0.0)}[attempt % 3]
        threads = [
            racer(
                barrier,
                lambda run_id=run.pk: services.tool_result_report(
                    run_id=run_id,
                    tool_call_id="call_charge",
                    execution_state="succeeded",
                    operation_id="ch_1",
                    observation="charge ch_1 captured",
                    actor=AGENT,
                ),
                results,
                "success",
                late_success,
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
            thread.join(10)
        assert not any(isinstance(value, Exception) for value in results.values()), results
        # the worker saw the stop and drains with its own (stale) view: "I don't know"
        services.run_drained(
            run_id=run.pk,
            lease_token=lease.token,
            epoch=1,
            actor=AGENT,
            observations=[
                {
                    "tool_call_id": "call_charge",
                    "execution_state": "unknown",
                    "observation": "stopped while waiting for the PSP",
                }
            ],
        )
        record = ExecutionRecord.objects.get(run=run, tool_call_id="call_charge")
        # the success and its evidence stand; the stale "unknown" is only a ledgered fact
        assert (record.execution_state, record.side_effect_state) == (
            ExecutionState.SUCCEEDED,
            SideEffectState.APPLIED,
        )
        assert record.operation_id == "ch_1" and record.last_observation == "charge ch_1 captured"
        kept = LedgerEntry.objects.filter(run=run, action="tool.result").order_by("run_seq").last()
        assert (kept.payload["reported"], kept.payload["kept"]) == ("unknown", "succeeded")
        success_ledgered_first = actions(run.pk).index("tool.result") < actions(run.pk).index(
            "run.stop_requested"
        )
        assert record.reported_after_stop is not success_ledgered_first
        orders[
            "success first" if success_ledgered_first else "success reported after the stop"
        ] += 1
        # nothing more starts: no permit, no new outbox item, the queued one frozen and unsent
        with pytest.raises(StaleEpoch):
            services.permit_request(
                run_id=run.pk, epoch=1, tool_call_id="call_next", tool="ship_order", actor=AGENT
            )
        with pytest.raises(StaleEpoch):
            services.outbox_enqueue(
                run_id=run.pk,
                epoch=1,
                transport="webhook",
                destination=receiver.url("/hooks/x"),
                payload={},
                idempotency_key=f"late-{attempt}",
                actor=AGENT,
            )
        assert dispatch.dispatch_pending(limit=10) == 0
        assert [item.status for item in outbox_seen(run)] == [OutboxStatus.FROZEN]
        assert wait_status(run.pk, RunStatus.STOPPED_CLEANLY).status == RunStatus.STOPPED_CLEANLY
    print(f"\nsuccess/stop race outcomes over 12 runs: {dict(orders)}")
    assert set(orders) == {"success first", "success reported after the stop"}
    assert receiver.count() == 0


def test_remote_done_but_response_lost_stays_unknown_and_is_never_resent(stack, receiver):
    """Row 10 (远端完成，但响应丢失): unknown until verified by a query; the write is never repeated."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Pay out seller 311", "fault-bot", steps=planned(("payout", "tool_write"))
    )["id"]
    outbox_key, direct_key = f"{run_id}-ledger", f"{run_id}-payout"
    lost: list[BaseException] = []
    items: list[dict[str, Any]] = []

    def work() -> None:
        with leased(client, run_id) as run:
            with run.step("payout", "Pay out the seller", kind="tool_write"):
                # 1. through the outbox: the server's dispatcher sends it, the answer is lost
                with run.tool_call(
                    "post_ledger_entry",
                    {"seller": 311},
                    side_effect="write",
                    tool_call_id="call_ledger",
                    idempotency_key=outbox_key,
                    recovery_policy="query_original",
                ) as call:
                    item = run.enqueue_outbox(
                        "webhook",
                        receiver.url("/drop/ledger"),
                        {"seller": 311, "amount": 90},
                        idempotency_key=outbox_key,
                    )
                    items.append(item)
                    call.set_operation_id(str(item["id"]))
                    call.result = item
                # 2. the tool calls the remote itself, and the answer is lost
                try:
                    with run.tool_call(
                        "create_payout",
                        {"seller": 311},
                        side_effect="write",
                        tool_call_id="call_payout",
                        idempotency_key=direct_key,
                        operation_id="payout-311",
                        recovery_policy="query_original",
                    ):
                        with httpx.Client(trust_env=False, timeout=5) as http:
                            http.post(
                                receiver.url("/drop/payouts"),
                                json={"seller": 311},
                                headers={"Idempotency-Key": direct_key},
                            )
                except httpx.TransportError as error:
                    lost.append(error)
                run.token.wait(15)  # a careful agent does not retry a write it cannot verify
                run.token.raise_if_cancelled()

    worker = WorkerThread(work)
    worker.start()
    item = OutboxItem.objects.get(
        pk=int(str(wait_until(lambda: items, what="the outbox item")[0]["id"]).split("_")[-1])
    )
    wait_until(
        lambda: OutboxItem.objects.get(pk=item.pk).status == OutboxStatus.UNKNOWN,
        what="outbox unknown",
    )
    wait_until(lambda: lost, what="the direct call to fail")
    threading.Event().wait(1.0)  # ten dispatcher ticks: an unknown item must never be claimed again
    assert receiver.count(outbox_key) == 1 and receiver.count(direct_key) == 1
    assert actions(run_id).count("outbox.claimed") == 1
    assert receiver.applied(outbox_key) and receiver.applied(direct_key)  # the remote did the work

    reviewer.cancel(run_id, "user_stop", note="verify the payout before anything else")
    worker.outcome()
    run = wait_status(run_id, RunStatus.STOPPED_DIRTY)
    payout = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_payout")
    assert (payout.execution_state, payout.side_effect_state) == (
        ExecutionState.UNKNOWN,
        SideEffectState.PENDING_VERIFICATION,
    )
    assert "RemoteProtocolError" in payout.last_observation
    packet = StopPacket.objects.get(run_id=run_id, stop_epoch=run.stop_epoch).snapshot
    assert packet["in_flight_outbox_ids"] == [item.public_id]
    assert [u["tool_call_id"] for u in packet["unconfirmed_side_effects"]] == ["call_payout"]
    assert (
        packet["unconfirmed_side_effects"][0]["recovery_action"]
        == "query payout-311; do not re-run create_payout"
    )
    assert set(packet["dirty_reasons"]) == {"unconfirmed_side_effects", "outbox_in_flight"}

    # verified by querying the original operations, then resolved: clean, and nothing re-sent
    with httpx.Client(trust_env=False, timeout=5) as http:
        for key in (outbox_key, direct_key):
            assert http.get(receiver.url(f"/operations/{key}")).json()["applied"] is True
    reviewer.resolve(
        run_id,
        target="outbox",
        id=item.public_id,
        decision="applied",
        evidence=f"receiver reports {outbox_key} applied",
    )
    reviewer.resolve(
        run_id,
        target="tool_call",
        id="call_payout",
        decision="applied",
        evidence=f"receiver reports {direct_key} applied",
    )
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    threading.Event().wait(0.5)
    assert receiver.count(outbox_key) == 1 and receiver.count(direct_key) == 1
    assert receiver.duplicates() == {}


def test_agent_crash_before_saving_result_is_found_unconfirmed_and_recovered_by_policy(
    stack, receiver
):
    """Row 12 (Agent 在保存结果前崩溃): after a restart the unconfirmed operation is found and
    handled by its recovery policy (query the original), never re-run."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Export ledger batch 7",
        "fault-bot",
        steps=planned(("export", "tool_write"), ("announce", "tool_write")),
    )["id"]
    key = f"{run_id}-export"
    crashed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.faults.crashing_worker",
            stack.url,
            stack.agent_raw,
            run_id,
            receiver.url("/hooks/finance"),
            key,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    assert crashed.stdout.strip() == "applied"
    assert receiver.count(key) == 1

    # the server notices the dead worker (its lease runs out) and records what it cannot know
    run = wait_status(run_id, RunStatus.INTERRUPTED, timeout=15)
    assert run.interruption["reason"] == "lease_expired"
    assert run.interruption["calls_in_flight"] == ["call_export"]
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_export")
    assert (record.execution_state, record.side_effect_state, record.observation_source) == (
        ExecutionState.UNKNOWN,
        SideEffectState.PENDING_VERIFICATION,
        "interruption",
    )
    # a blind resume is refused while the outcome is unknown
    with pytest.raises(ApiError) as refused:
        reviewer.resume(run_id)
    assert refused.value.status_code == 409

    # the restarted agent: stop the interrupted run, read what is unconfirmed, follow the policy
    reviewer.cancel(run_id, "user_stop", note="recover after the worker crashed")
    wait_status(run_id, RunStatus.STOPPED_DIRTY)
    packet = client.stop_packet(run_id)
    unconfirmed = packet["unconfirmed_side_effects"]
    assert [(u["tool_call_id"], u["operation_id"], u["idempotency_key"]) for u in unconfirmed] == [
        ("call_export", "export-7", key)
    ]
    assert unconfirmed[0]["recovery_policy"] == "query_original"
    assert unconfirmed[0]["recovery_action"] == "query export-7; do not re-run finance_export"
    with httpx.Client(trust_env=False, timeout=5) as http:
        applied = http.get(receiver.url(f"/operations/{key}")).json()["applied"]
    assert applied is True
    reviewer.resolve(
        run_id,
        target="tool_call",
        id="call_export",
        decision="applied",
        evidence="finance system shows batch 7 under this idempotency key",
    )
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    reviewer.resume(run_id)
    with leased(client, run_id, worker_id="worker-restarted") as run:
        assert run.epoch == 3  # 1: the crashed round; 2: the stop; 3: this round
        with run.step("announce", "Announce the export", kind="tool_write"):
            with run.tool_call(
                "post_chat", {"text": "batch 7 exported"}, tool_call_id="call_announce"
            ) as call:
                call.result = "posted"
        run.complete({"export": "applied once, verified by query"})
    final = wait_status(run_id, RunStatus.COMPLETED)
    assert final.result == {"export": "applied once, verified by query"}
    assert receiver.count(key) == 1, "the write was repeated"
    assert (
        ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_export").side_effect_state
        == SideEffectState.APPLIED
    )
