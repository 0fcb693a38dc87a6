"""AgentRun and tool calls against a scripted in-process API (see conftest.FakeApi)."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest
from agent_fakes import FakeApi, refusal

from safestop_agent import AgentRun, Cancelled, SafestopClient, ToolCallConflict
from tests.support.waiting import wait_until


def leased(client: SafestopClient, *, ttl_seconds: float = 30) -> AgentRun:
    return AgentRun(client, "run_1", "worker-1", ttl_seconds=ttl_seconds, push=False)


def results_for(api: FakeApi, tool_call_id: str) -> list[dict[str, Any]]:
    return api.sent(f"tool-calls/{tool_call_id}/result/")


def test_lease_is_acquired_and_released_when_the_block_ends_normally(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        assert (run.lease_id, run.epoch) == ("lease_tok", 3)
    assert fake_api.sent("lease/") == [{"worker_id": "worker-1", "ttl_seconds": 30}]
    assert fake_api.sent("lease/release/") == [{"lease_id": "lease_tok", "epoch": 3}]
    assert fake_api.sent("drained/") == []


def test_refused_permit_raises_cancelled_and_the_tool_body_never_runs(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    fake_api.overrides["permits/"] = lambda request, body: refusal("stale_epoch", stop_epoch=4)
    body_ran = False
    with leased(client) as run:
        with run.tool_call(
            "deploy", {"service": "api"}, side_effect="write", tool_call_id="call_1"
        ):
            body_ran = True
        pytest.fail("Cancelled must leave the block")  # pragma: no cover

    assert body_ran is False
    assert run.token.cancelled and run.token.reason == "stale_epoch" and run.token.stop_epoch == 4
    assert results_for(fake_api, "call_1") == [], "a call that never started reports no outcome"
    assert fake_api.sent("lease/release/") == [], "a stopped worker drains instead of releasing"
    (drained,) = fake_api.sent("drained/")
    assert drained["lease_id"] == "lease_tok" and drained["epoch"] == 3
    assert drained["observations"][0] == {
        "kind": "stop_seen",
        "reason": "stale_epoch",
        "stop_epoch": 4,
    }


def test_a_call_queued_after_the_stop_never_asks_for_a_permit(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        run.token.cancel("user_stop", stop_epoch=4)
        with run.tool_call("search", {"q": "x"}):
            pytest.fail("must not run")  # pragma: no cover
    assert fake_api.sent("permits/") == []


def test_permit_carries_the_lease_epoch_and_the_client_ids(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        with run.tool_call(
            "deploy",
            {"service": "api"},
            side_effect="write",
            tool_call_id="call_7",
            idempotency_key="idem-7",
            operation_id="deploy-77",
            recovery_policy="query_original",
        ) as call:
            call.result = "deployed"
    (permit,) = fake_api.sent("permits/")
    assert permit == {
        "epoch": 3,
        "tool_call_id": "call_7",
        "tool": "deploy",
        "side_effect": "write",
        "arguments": {"service": "api"},
        "idempotency_key": "idem-7",
        "operation_id": "deploy-77",
        "recovery_policy": "query_original",
    }
    (result,) = results_for(fake_api, "call_7")
    assert result["execution_state"] == "succeeded"
    assert result["observation"] == "deployed"


def test_a_write_interrupted_by_an_error_is_reported_unknown_never_failed(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with pytest.raises(TimeoutError):
        with leased(client) as run:
            with run.tool_call(
                "deploy", {"v": 2}, side_effect="write", tool_call_id="call_2"
            ) as call:
                call.set_operation_id("deploy-77")
                call.observe("request submitted, waiting for status")
                raise TimeoutError("remote did not answer")
    (result,) = results_for(fake_api, "call_2")
    assert result["execution_state"] == "unknown"
    assert result["operation_id"] == "deploy-77"
    assert result["observation"].startswith("request submitted, waiting for status")
    assert "TimeoutError: remote did not answer" in result["observation"]
    assert fake_api.sent("lease/release/"), "a crash that is not a stop releases the lease"


def test_a_write_cancelled_mid_call_is_unknown_and_the_run_drains(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        with run.tool_call("deploy", {}, side_effect="write", tool_call_id="call_3") as call:
            call.set_remote_cancel_state("requested")
            run.token.cancel("user_stop", stop_epoch=4)
            run.token.raise_if_cancelled()
    (result,) = results_for(fake_api, "call_3")
    assert result["execution_state"] == "unknown"
    assert result["remote_cancel_state"] == "requested"
    assert "interrupted by stop (user_stop)" in result["observation"]
    (drained,) = fake_api.sent("drained/")
    assert {
        "kind": "tool_call",
        "tool_call_id": "call_3",
        "tool": "deploy",
        "side_effect": "write",
        "reported": True,
    } in drained["observations"], "a reported outcome is not re-applied by the drain"


def test_an_outcome_that_could_not_be_reported_travels_with_the_drain(
    client: SafestopClient, fake_api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("safestop_agent.worker.FACT_BASE_DELAY", 0.001)

    def down(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        raise httpx.ConnectError("down", request=request)

    fake_api.overrides["tool-calls/call_8/result/"] = down
    with leased(client) as run:
        with run.tool_call("deploy", {}, side_effect="write", tool_call_id="call_8") as call:
            call.set_operation_id("deploy-88")
            call.observe("submitted")
            run.token.cancel("user_stop", stop_epoch=4)
            run.token.raise_if_cancelled()
    assert len(results_for(fake_api, "call_8")) == 4, "the report was retried before giving up"
    (drained,) = fake_api.sent("drained/")
    (observation,) = [o for o in drained["observations"] if o.get("tool_call_id") == "call_8"]
    assert observation["reported"] is False
    assert observation["execution_state"] == "unknown"
    assert observation["operation_id"] == "deploy-88"
    assert observation["observation"].startswith("submitted")


def test_a_recorded_result_is_not_overwritten_by_a_later_stop(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        with run.tool_call("deploy", {}, side_effect="write", tool_call_id="call_4") as call:
            call.result = {"status": "done"}
            run.token.cancel("user_stop", stop_epoch=4)  # the stop lands just after the success
            run.token.raise_if_cancelled()
    (result,) = results_for(fake_api, "call_4")
    assert result["execution_state"] == "succeeded"


def test_a_cancelled_that_is_not_our_stop_is_not_swallowed(client: SafestopClient) -> None:
    with pytest.raises(Cancelled):
        with leased(client):
            raise Cancelled("someone else's token")


def test_a_failing_read_is_reported_failed_and_the_error_propagates(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with pytest.raises(ValueError, match="bad query"):
        with leased(client) as run:
            with run.tool_call("search", {"q": ""}, tool_call_id="call_5"):
                raise ValueError("bad query")
    (result,) = results_for(fake_api, "call_5")
    assert result["execution_state"] == "failed"


def test_result_reporting_is_retried_on_network_errors(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    attempts: list[int] = []

    def flaky(request: httpx.Request, body: dict[str, Any]) -> httpx.Response | None:
        attempts.append(1)
        if len(attempts) < 3:
            raise httpx.ConnectError("connection reset", request=request)
        return None

    fake_api.overrides["tool-calls/call_6/result/"] = flaky
    with leased(client) as run:
        with run.tool_call("search", {}, tool_call_id="call_6") as call:
            call.result = "found"
    assert len(attempts) == 3
    assert call.reported and call.execution_state == "succeeded"


def test_heartbeat_signal_sets_the_token(client: SafestopClient, fake_api: FakeApi) -> None:
    fake_api.heartbeat_signal = {
        "type": "cancel_requested",
        "reason": "manual_takeover",
        "requested_by": "alice",
        "stop_epoch": 4,
    }
    with leased(client, ttl_seconds=0.3) as run:
        assert run.token.wait(2.0), "the heartbeat (every ttl/3 = 0.1 s) must deliver the stop"
    assert (run.token.reason, run.token.requested_by, run.token.stop_epoch) == (
        "manual_takeover",
        "alice",
        4,
    )
    assert fake_api.sent("lease/heartbeat/")[0] == {"lease_id": "lease_tok", "epoch": 3}
    assert fake_api.sent("drained/")


def test_a_signal_for_an_older_epoch_is_ignored(client: SafestopClient, fake_api: FakeApi) -> None:
    fake_api.heartbeat_signal = {
        "type": "cancel_requested",
        "reason": "user_stop",
        "requested_by": "alice",
        "stop_epoch": 3,
    }
    with leased(client, ttl_seconds=0.3) as run:
        assert wait_until(lambda: len(fake_api.sent("lease/heartbeat/")) >= 2)
        assert not run.token.cancelled, (
            "a stop at or before our lease's epoch belongs to an earlier round"
        )


def test_a_revoked_lease_sets_the_token(client: SafestopClient, fake_api: FakeApi) -> None:
    fake_api.overrides["lease/heartbeat/"] = lambda request, body: refusal(
        "lease_revoked", status="stopped_dirty", stop_epoch=5
    )
    with leased(client, ttl_seconds=0.3) as run:
        assert run.token.wait(2.0)
    assert run.token.reason == "lease_revoked" and run.token.stop_epoch == 5


def test_steps_report_started_and_completed_or_failed(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with pytest.raises(RuntimeError):
        with leased(client) as run:
            with run.step("search", "Search the docs", kind="tool_read"):
                pass
            with run.step("summarise", "Summarise", kind="model_call"):
                raise RuntimeError("model error")
    started = fake_api.events_of_type("step.started")
    assert [(e["key"], e["name"], e["kind"]) for e in started] == [
        ("search", "Search the docs", "tool_read"),
        ("summarise", "Summarise", "model_call"),
    ]
    assert [e["key"] for e in fake_api.events_of_type("step.completed")] == ["search"]
    (failed,) = fake_api.events_of_type("step.failed")
    assert failed["key"] == "summarise" and failed["cancelled"] is False
    batches = fake_api.sent("events/")
    assert all(batch["epoch"] == 3 for batch in batches)
    event_ids = [e["event_id"] for batch in batches for e in batch["events"]]
    assert len(set(event_ids)) == len(event_ids) == 4


def test_a_rejected_step_start_stops_the_worker_before_the_step_runs(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    def reject(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        event = body["events"][0]
        status = "rejected" if event["type"] == "step.started" else "accepted"
        return httpx.Response(
            200,
            json={
                "results": [
                    {"event_id": event["event_id"], "status": status, "code": "stale_epoch"}
                ]
            },
        )

    fake_api.overrides["events/"] = reject
    body_ran = False
    with leased(client) as run:
        with run.step("notify", "Notify", kind="external_action"):
            body_ran = True
    assert body_ran is False
    assert run.token.reason == "stale_epoch"


def test_checkpoint_artifact_completion_and_outbox(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        run.checkpoint("checkpoint_01", {"cursor": 10}, step_seq=1)
        run.artifact("report.md", kind="markdown", content="# hi", reusable=True)
        item = run.enqueue_outbox("webhook", "http://hooks.local/x", {"a": 1}, idempotency_key="k1")
        answer = run.complete({"answer": 42})
    assert item["id"] == "outbox_1"
    assert fake_api.sent("outbox/") == [
        {
            "epoch": 3,
            "transport": "webhook",
            "destination": "http://hooks.local/x",
            "payload": {"a": 1},
            "idempotency_key": "k1",
        }
    ]
    (checkpoint,) = fake_api.events_of_type("checkpoint.saved")
    assert checkpoint["label"] == "checkpoint_01" and checkpoint["state"] == {"cursor": 10}
    (artifact,) = fake_api.events_of_type("artifact.added")
    assert artifact["checksum"].startswith("sha256:") and artifact["reusable"] is True
    (completed,) = fake_api.events_of_type("run.completed")
    assert completed["result"] == {"answer": 42}
    assert answer["status"] == "accepted" and run.completed


def test_outbox_refused_after_stop_raises_cancelled(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    fake_api.overrides["outbox/"] = lambda request, body: refusal("run_not_running")
    with leased(client) as run:
        run.enqueue_outbox("webhook", "http://hooks.local/x", {})
        pytest.fail("must not continue")  # pragma: no cover
    assert run.token.reason == "run_not_running"


def test_a_permit_names_the_step_open_in_its_thread(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        with run.tool_call("plan", {}, tool_call_id="call_outside") as call:
            call.result = "ok"
        with run.step("search", "Search", kind="tool_read"):
            with run.tool_call("search", {"q": "a"}, tool_call_id="call_inside") as call:
                call.result = "ok"
    by_id = {p["tool_call_id"]: p for p in fake_api.sent("permits/")}
    assert "step_key" not in by_id["call_outside"]
    assert by_id["call_inside"]["step_key"] == "search"


def test_parallel_calls_keep_separate_outcomes_when_one_is_stopped(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    both_started = threading.Barrier(3)

    def quick_read(run: AgentRun) -> None:
        with run.tool_call("search", {}, tool_call_id="call_read") as call:
            both_started.wait()
            call.result = "found"

    def slow_write(run: AgentRun) -> None:
        with run.tool_call("deploy", {}, side_effect="write", tool_call_id="call_write") as call:
            call.observe("deploy submitted")
            both_started.wait()
            run.token.wait(5)
            run.token.raise_if_cancelled()

    with leased(client) as run:
        errors: list[BaseException] = []

        def guarded(fn: Any) -> None:
            try:
                fn(run)
            except Cancelled as error:
                errors.append(error)

        threads = [threading.Thread(target=guarded, args=(fn,)) for fn in (quick_read, slow_write)]
        for thread in threads:
            thread.start()
        both_started.wait()
        run.token.cancel("user_stop", stop_epoch=4)
        for thread in threads:
            thread.join(5)

    assert [type(e) for e in errors] == [Cancelled]
    assert results_for(fake_api, "call_read")[0]["execution_state"] == "succeeded"
    assert results_for(fake_api, "call_write")[0]["execution_state"] == "unknown"


def test_a_tool_call_conflict_reports_nothing_onto_the_first_calls_record(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    """The id names another call, which may be running or done: marking it `not_started` would
    rewrite that call's record. The conflict is raised; no outcome is reported; no body runs."""
    fake_api.overrides["permits/"] = lambda request, body: httpx.Response(
        409,
        json={
            "error": "tool_call_conflict",
            "detail": "call_1 was first asked for send_email",
            "tool_call_id": "call_1",
            "first_tool": "send_email",
            "first_arguments": {"to": "a"},
        },
    )
    body_ran = False
    with leased(client) as run:
        with pytest.raises(ToolCallConflict) as caught:
            with run.tool_call("lookup", {"q": "x"}, tool_call_id="call_1"):
                body_ran = True
    assert body_ran is False
    assert caught.value.body["first_tool"] == "send_email"
    assert results_for(fake_api, "call_1") == []


def test_a_stopped_worker_says_drained_before_it_stops_listening(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    """Closing the listeners waits for the push socket's closing handshake and a heartbeat in
    flight: the run's `stopped_cleanly` does not wait for them."""
    order: list[str] = []

    def drained(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        order.append("drained")
        return fake_api.default_answer("drained/", body)

    fake_api.overrides["drained/"] = drained
    with leased(client) as run:
        assert run._heartbeat is not None
        stop_heartbeat = run._heartbeat.stop

        def stopped(timeout: float | None = None) -> None:
            order.append("listening stopped")
            stop_heartbeat(timeout)

        run._heartbeat.stop = stopped  # type: ignore[method-assign]
        run.handle_stop_signal({"type": "cancel_requested", "stop_epoch": 4})

    assert order == ["drained", "listening stopped"]
    assert fake_api.sent("lease/release/") == []


def test_a_worker_that_gives_its_lease_back_stops_listening_first(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    order: list[str] = []

    def released(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        order.append("released")
        return fake_api.default_answer("lease/release/", body)

    fake_api.overrides["lease/release/"] = released
    with leased(client) as run:
        assert run._heartbeat is not None
        stop_heartbeat = run._heartbeat.stop

        def stopped(timeout: float | None = None) -> None:
            order.append("listening stopped")
            stop_heartbeat(timeout)

        run._heartbeat.stop = stopped  # type: ignore[method-assign]

    assert order == ["listening stopped", "released"]
    assert fake_api.sent("drained/") == []
