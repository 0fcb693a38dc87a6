"""Seed 001 §6, rows 1-3: work that has not started must never start after a stop.

Each test drives `safestop_agent` against a live server (HTTP + websocket push) and asserts on
the worker's own side (what ran) and on the server's records (execution records, steps,
ledger, stop packet) — not on the UI.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from handoff.models import StopPacket
from runs.models import ExecutionRecord, ExecutionState, Run, RunStatus, Step, StepStatus
from safestop_agent import AgentRun, Cancelled, Refused, StreamOutcome, collect_tool_calls, retry
from tests.support.stack import WorkerThread, actions, leased, planned, wait_status

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_while_tool_is_queued_never_starts_it(stack):
    """Row 1 (工具尚在排队时取消): no start; the history says it was not executed."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Triage inbox", "fault-bot", steps=planned(("act", "tool_read"), ("report", "model_call"))
    )["id"]
    queue = [("search", "none"), ("fetch_thread", "none"), ("send_email", "write")]
    ran: list[str] = []
    refused_at: dict[str, str] = {}
    first_running = threading.Event()

    runs: list[AgentRun] = []

    def work() -> Any:
        with leased(client, run_id, into=runs) as run:
            with run.step("act", "Run the model's tool calls", kind="tool_read"):
                for tool, effect in queue:
                    try:
                        with run.tool_call(
                            tool, {"tool": tool}, side_effect=effect, tool_call_id=f"call_{tool}"
                        ) as call:
                            ran.append(tool)
                            if tool == "search":
                                first_running.set()
                                # An uninterruptible read: it finishes even though the stop
                                # arrives (by push) while it runs. The queue must stop here.
                                assert run.token.wait(10), "the stop never reached the worker"
                            call.result = f"{tool} done"
                    except Cancelled as stopped:
                        refused_at[tool] = str(stopped.reason)
                # the queue is done: the step did not complete, the stop ended it
                run.token.raise_if_cancelled()

    worker = WorkerThread(work)
    worker.start()
    assert first_running.wait(10)
    reviewer.cancel(run_id, "user_stop", note="wrong inbox")
    worker.outcome()
    run = runs[0]

    # the worker: the queued tools' bodies never ran; each was refused before asking a permit
    assert ran == ["search"]
    assert set(refused_at) == {"fetch_thread", "send_email"}
    assert run.token.reason == "user_stop"
    # the server: only the first call was ever permitted; the queued ones left no intent
    final = wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    records = {r.tool_call_id: r for r in ExecutionRecord.objects.filter(run_id=run_id)}
    assert set(records) == {"call_search"}
    assert records["call_search"].execution_state == ExecutionState.SUCCEEDED
    assert actions(run_id).count("tool.permitted") == 1
    # a stale worker asking anyway is refused, counted, and still leaves no record
    with pytest.raises(Refused) as refusal:
        client.request_permit(
            run_id,
            epoch=run.epoch,
            tool_call_id="call_fetch_thread",
            tool="fetch_thread",
            side_effect="none",
            arguments={},
        )
    assert refusal.value.code == "stale_epoch"
    assert not ExecutionRecord.objects.filter(
        run_id=run_id, tool_call_id="call_fetch_thread"
    ).exists()
    assert Run.objects.get(pk=run_id).late_writes_rejected == final.late_writes_rejected + 1
    # history: the packet lists only the executed call; the rest of the plan is still pending
    packet = StopPacket.objects.get(run_id=run_id, stop_epoch=final.stop_epoch).snapshot
    assert [call["tool_call_id"] for call in packet["tool_calls"]] == ["call_search"]
    assert {step["key"]: step["status"] for step in packet["pending_steps"]} == {
        "act": StepStatus.FAILED,
        "report": StepStatus.PLANNED,
    }
    assert packet["unconfirmed_side_effects"] == []


def test_cancel_during_retry_backoff_ends_the_wait_and_starts_no_next_attempt(stack, receiver):
    """Row 2 (重试退避时取消): the wait ends promptly; no further ordinary retry."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Refresh FX rates", "fault-bot", steps=planned(("rates", "tool_read"))
    )["id"]
    flaky = receiver.url("/status/503/rates")  # the rates service is down: every attempt fails
    attempts: list[float] = []
    cancelled_at: list[float] = []

    def fetch_rates() -> Any:
        attempts.append(time.monotonic())
        with httpx.Client(trust_env=False, timeout=5) as http:
            response = http.post(
                flaky,
                json={"pairs": ["EURUSD"]},
                headers={"Idempotency-Key": f"rates-{len(attempts)}"},
            )
        response.raise_for_status()
        return response.json()

    def work() -> Any:
        with leased(client, run_id) as run:
            with run.step("rates", "Fetch FX rates", kind="tool_read"):
                with run.tool_call(
                    "fetch_rates", {"pairs": ["EURUSD"]}, tool_call_id="call_rates"
                ) as call:
                    try:
                        # A minute between attempts: a stop must not wait for it.
                        call.result = retry(
                            fetch_rates,
                            token=run.token,
                            attempts=5,
                            base_delay=60.0,
                            max_delay=60.0,
                            jitter=False,
                            retry_if=lambda error: True,
                        )
                    except Cancelled:
                        cancelled_at.append(time.monotonic())
                        raise
            return run

    worker = WorkerThread(work)
    worker.start()
    assert receiver.wait_for(1, timeout=10)
    time.sleep(0.3)  # the first attempt failed: the worker is now in its one-minute backoff
    stop_sent = time.monotonic()
    reviewer.cancel(run_id, "user_stop", note="rates are not needed")
    worker.outcome()

    waited = cancelled_at[0] - stop_sent
    print(f"\nretry backoff ended {waited * 1000:.0f} ms after the stop (backoff was 60 s)")
    # Not a speed figure (bench/ has those): a backoff that ran its course would end a minute
    # later, a busy machine delivers the stop in seconds.
    assert waited < 30, "the stop did not end the retry backoff"
    time.sleep(0.5)
    assert len(attempts) == 1 and receiver.count() == 1, "an attempt started after the stop"
    wait_status(run_id, RunStatus.STOPPED_CLEANLY)
    record = ExecutionRecord.objects.get(run_id=run_id, tool_call_id="call_rates")
    assert record.execution_state == ExecutionState.FAILED
    assert "interrupted by stop" in record.last_observation
    assert actions(run_id).count("tool.permitted") == 1


def _half_tool_call_stream(
    ending: str, half_sent: threading.Event, token: Any
) -> Iterator[dict[str, Any]]:
    """A model answer whose tool call arrives in fragments; it ends as `ending` says."""
    yield {
        "choices": [
            {
                "delta": {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_half",
                            "type": "function",
                            "function": {"name": "delete_branch", "arguments": ""},
                        }
                    ]
                }
            }
        ]
    }
    yield {
        "choices": [
            {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"branch": "rel'}}]}}
        ]
    }
    half_sent.set()
    if ending == "stop_arrives_mid_arguments":
        assert token.wait(10), "the stop never reached the worker"
    elif ending == "stream_breaks":
        raise httpx.RemoteProtocolError(
            "peer closed connection without sending complete message body"
        )
    elif ending == "cut_off_by_length":
        yield {"choices": [{"delta": {}, "finish_reason": "length"}]}
        return
    yield {
        "choices": [
            {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'ease-1.4"}'}}]}}
        ]
    }
    yield {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]}


@pytest.mark.parametrize(
    "ending", ["stop_arrives_mid_arguments", "stream_breaks", "cut_off_by_length"]
)
def test_half_streamed_tool_call_is_never_executed_nor_reported_complete(stack, ending):
    """Row 3 (模型流只返回半截工具参数): the incomplete call is not run; no fake completion."""
    client, reviewer = stack.agent(), stack.reviewer()
    run_id = client.create_run(
        "Clean up branches",
        "fault-bot",
        steps=planned(("plan", "model_call"), ("act", "tool_write")),
    )["id"]
    half_sent = threading.Event()
    outcomes: list[StreamOutcome] = []
    executed: list[str] = []

    def work() -> Any:
        with leased(client, run_id) as run:
            try:
                with run.step("plan", "Ask the model what to do", kind="model_call"):
                    outcome = collect_tool_calls(
                        _half_tool_call_stream(ending, half_sent, run.token), token=run.token
                    )
                    outcomes.append(outcome)
                    run.token.raise_if_cancelled()
                    if not outcome.finished:
                        raise RuntimeError(f"model answer incomplete: {outcome.interrupted_by}")
            except RuntimeError as broken:
                run.fail(str(broken))
                return run
            for call in outcome.calls:
                with run.step("act", "Run the tool", kind="tool_write"):
                    with run.tool_call(
                        call.name, call.arguments, side_effect="write", tool_call_id=call.id
                    ):
                        executed.append(call.id)
            run.complete({"calls": len(outcome.calls)})
            return run

    worker = WorkerThread(work)
    worker.start()
    assert half_sent.wait(10)
    if ending == "stop_arrives_mid_arguments":
        reviewer.cancel(run_id, "user_stop", note="not that branch")
    worker.outcome()

    outcome = outcomes[0]
    assert outcome.calls == [] and not outcome.finished
    assert [(d.id, d.name, d.arguments_text) for d in outcome.discarded] == [
        ("call_half", "delete_branch", '{"branch": "rel')
    ]
    assert executed == []
    expected = (
        RunStatus.STOPPED_CLEANLY if ending == "stop_arrives_mid_arguments" else RunStatus.FAILED
    )
    final = wait_status(run_id, expected)
    # no permit, no result, no completed step, no completed run was fabricated
    assert not ExecutionRecord.objects.filter(run_id=run_id).exists()
    steps = dict(Step.objects.filter(run_id=run_id).values_list("key", "status"))
    assert steps == {"plan": StepStatus.FAILED, "act": StepStatus.PLANNED}
    assert final.result is None
    assert not {"tool.permitted", "tool.result", "run.completed"} & set(actions(run_id))
