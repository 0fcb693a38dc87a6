"""Tool calls and outbox items that wait for a reviewer (DESIGN §10), against fakes.

The server side is scripted: the permit answers 202 with an approval and no
`permit_id`, decisions arrive as `approval.decided` frames (handed to the run
as the push listener would, or over a real local websocket) or from the
approval's GET. The live-server version is in tests/agent_e2e/.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from agent_fakes import FakeApi
from websockets.sync.server import ServerConnection, serve

from safestop_agent import (
    AgentRun,
    ApprovalRejected,
    Cancelled,
    CancelToken,
    NoPermit,
    SafestopClient,
)
from safestop_agent.approvals import (
    NOT_GIVEN,
    ApprovalBoard,
    decision_from_approval,
    decision_from_frame,
)
from tests.support.waiting import wait_until

# A test whose decision never comes would otherwise wait as long as a real call may.
pytestmark = pytest.mark.timeout(60)

APPROVAL_PATH = "/api/v1/approvals/appr_1/"


def leased(client: SafestopClient, **options: Any) -> AgentRun:
    options.setdefault("approval_poll_interval", 60.0)  # no polling unless a test asks for it
    return AgentRun(client, "run_1", "worker-1", push=False, **options)


def waiting_permit(
    request: httpx.Request, body: dict[str, Any], *, approval: Any = None
) -> httpx.Response:
    """The 202 a permit gets when a reviewer must decide first: no `permit_id`."""
    if approval is None:
        approval = {"id": "appr_1", "status": "waiting", "deadline": "soon", "rule": "payments"}
    return httpx.Response(
        202,
        json={"tool_call_id": body["tool_call_id"], "epoch": body["epoch"], "approval": approval},
    )


def decided(decision: str, **fields: Any) -> dict[str, Any]:
    frame = {
        "type": "approval.decided",
        "approval_id": "appr_1",
        "tool_call_id": "call_pay",
        "decision": decision,
        "arguments": None,
        "message": "",
        "permit_id": None,
    }
    frame.update(fields)
    return frame


def decide_later(
    run: AgentRun, api: FakeApi, *actions: Callable[[], object], after: str = "permits/"
) -> threading.Thread:
    """Once `after` was asked (the call now waits), run `actions` in another thread."""

    def act() -> None:
        assert wait_until(lambda: api.sent(after)), f"{after} was never asked"
        time.sleep(0.02)  # let the caller reach its wait
        for action in actions:
            action()

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def results_for(api: FakeApi, tool_call_id: str) -> list[dict[str, Any]]:
    return api.sent(f"tool-calls/{tool_call_id}/result/")


@pytest.fixture
def api(fake_api: FakeApi) -> FakeApi:
    fake_api.overrides["permits/"] = waiting_permit
    return fake_api


# -- a tool call that waits --------------------------------------------------------------


def test_an_approved_call_runs_with_the_reviewers_edited_arguments(
    client: SafestopClient, api: FakeApi
) -> None:
    seen: list[Any] = []
    with leased(client) as run:
        decide_later(
            run,
            api,
            lambda: run.handle_push_frame(
                decided(
                    "approve",
                    arguments={"amount": 90, "currency": "EUR"},
                    message="capped at 90",
                    permit_id="permit_9",
                )
            ),
        )
        with run.tool_call(
            "pay",
            {"amount": 120, "currency": "EUR"},
            side_effect="write",
            tool_call_id="call_pay",
            needs_approval=True,
            summary="Refund order 1042",
            risk="high",
            arguments_schema={"type": "object"},
        ) as call:
            seen.append(call.arguments)
            call.result = "paid"

    assert seen == [{"amount": 90, "currency": "EUR"}]
    assert call.original_arguments == {"amount": 120, "currency": "EUR"}
    assert call.arguments_edited and call.decision is not None
    assert call.decision.message == "capped at 90"
    assert call.permit["permit_id"] == "permit_9"
    (permit,) = api.sent("permits/")
    assert permit["needs_approval"] is True
    assert (permit["summary"], permit["risk"]) == ("Refund order 1042", "high")
    assert permit["arguments_schema"] == {"type": "object"}
    (result,) = results_for(api, "call_pay")
    assert result["execution_state"] == "succeeded"
    assert api.sent(APPROVAL_PATH) == [], "the push carried everything: no GET needed"


def test_a_permit_without_approval_fields_sends_none_of_them(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run, run.tool_call("search", {"q": "x"}) as call:
        call.result = "ok"
    (permit,) = fake_api.sent("permits/")
    assert not {"needs_approval", "summary", "risk", "arguments_schema"} & permit.keys()
    assert call.decision is None and not call.arguments_edited


@pytest.mark.parametrize(
    ("decision", "status", "message"),
    [
        ("reject", "rejected", "Do not refund orders older than 90 days."),
        ("expire", "expired", ""),
    ],
)
def test_a_rejected_or_expired_call_raises_with_the_message_and_never_runs(
    client: SafestopClient, api: FakeApi, decision: str, status: str, message: str
) -> None:
    body_ran = False
    with leased(client) as run:
        decide_later(run, api, lambda: run.handle_push_frame(decided(decision, message=message)))
        with pytest.raises(ApprovalRejected) as caught:
            with run.tool_call(
                "pay", {"amount": 120}, side_effect="write", tool_call_id="call_pay"
            ):
                body_ran = True
    assert body_ran is False
    error = caught.value
    assert (error.status, error.message, error.approval_id) == (status, message, "appr_1")
    assert error.approval["rule"] == "payments", "what the 202 said is kept with the decision"
    assert results_for(api, "call_pay") == [], "the server settled the call when it decided"
    assert not run.token.cancelled, "a rejection is not a stop: the run goes on"
    assert api.sent("lease/release/") and not api.sent("drained/")


def test_a_stop_during_the_wait_raises_cancelled_and_the_body_never_runs(
    client: SafestopClient, api: FakeApi
) -> None:
    body_ran = False
    started = time.monotonic()
    with leased(client) as run:
        decide_later(run, api, lambda: run.token.cancel("user_stop", stop_epoch=4))
        with run.tool_call("pay", {"amount": 1}, side_effect="write", tool_call_id="call_pay"):
            body_ran = True
        pytest.fail("Cancelled must leave the block")  # pragma: no cover
    assert body_ran is False
    assert time.monotonic() - started < 2, "the stop ends the wait at once, not at a poll"
    assert [r["execution_state"] for r in results_for(api, "call_pay")] == ["not_started"]
    (drained,) = api.sent("drained/")
    assert drained["observations"][0]["reason"] == "user_stop"


def test_a_stop_that_lands_with_the_approval_still_wins(
    client: SafestopClient, api: FakeApi
) -> None:
    body_ran = False
    with leased(client) as run:
        decide_later(
            run,
            api,
            lambda: run.token.cancel("user_stop", stop_epoch=4),
            lambda: run.handle_push_frame(decided("approve", arguments={}, permit_id="p")),
        )
        with run.tool_call("pay", {}, side_effect="write", tool_call_id="call_pay"):
            body_ran = True
    assert body_ran is False and run.token.reason == "user_stop"


def test_a_void_approval_from_a_stop_surfaces_as_cancelled(
    client: SafestopClient, api: FakeApi
) -> None:
    with leased(client) as run:
        # The void frame may arrive just before the stop signal: the worker waits for it.
        decide_later(
            run,
            api,
            lambda: run.handle_push_frame(decided("void")),
            lambda: time.sleep(0.05),
            lambda: run.token.cancel("user_stop", stop_epoch=4),
        )
        with run.tool_call("pay", {}, side_effect="write", tool_call_id="call_pay"):
            pytest.fail("must not run")  # pragma: no cover
    assert run.token.reason == "user_stop"


def test_a_void_approval_without_a_stop_raises_approval_rejected(
    client: SafestopClient, api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("safestop_agent.worker.VOID_GRACE_SECONDS", 0.05)
    with leased(client) as run:
        decide_later(run, api, lambda: run.handle_push_frame(decided("void")))
        with pytest.raises(ApprovalRejected) as caught:
            with run.tool_call("pay", {}, side_effect="write", tool_call_id="call_pay"):
                pytest.fail("must not run")  # pragma: no cover
    assert caught.value.status == "void"


@pytest.mark.parametrize(
    "answer",
    [
        {"tool_call_id": "call_pay", "epoch": 3},
        {"tool_call_id": "call_pay", "epoch": 3, "approval": {"status": "waiting"}},
        {"tool_call_id": "call_pay", "epoch": 3, "permit_id": ""},
    ],
    ids=["no-approval", "approval-without-id", "empty-permit-id"],
)
def test_an_answer_without_a_permit_id_never_runs_the_body(
    client: SafestopClient, fake_api: FakeApi, answer: dict[str, Any]
) -> None:
    fake_api.overrides["permits/"] = lambda request, body: httpx.Response(202, json=answer)
    body_ran = False
    with leased(client) as run:
        with pytest.raises(NoPermit):
            with run.tool_call("pay", {}, side_effect="write", tool_call_id="call_pay"):
                body_ran = True
    assert body_ran is False
    assert [r["execution_state"] for r in results_for(fake_api, "call_pay")] == ["not_started"]
    assert run.tool_calls == []


def test_an_approval_that_never_yields_a_permit_id_fails_closed(
    client: SafestopClient, api: FakeApi
) -> None:
    api.overrides[APPROVAL_PATH] = lambda request, body: httpx.Response(
        200, json={"id": "appr_1", "status": "approved", "arguments": {}, "permit_id": None}
    )
    with leased(client) as run:
        decide_later(run, api, lambda: run.handle_push_frame(decided("approve", permit_id=None)))
        with pytest.raises(NoPermit):
            with run.tool_call("pay", {}, side_effect="write", tool_call_id="call_pay"):
                pytest.fail("must not run")  # pragma: no cover


# -- the fallback: the approval's GET -----------------------------------------------------


def approval_answers(*statuses: str) -> Callable[[httpx.Request, dict[str, Any]], httpx.Response]:
    """The approval's GET answering each status in turn (the last one from then on)."""
    remaining = list(statuses)

    def answer(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        status = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        approved = status == "approved"
        return httpx.Response(
            200,
            json={
                "id": "appr_1",
                "run_id": "run_1",
                "epoch": 3,
                "target": "tool_call",
                "tool_call_id": "call_pay",
                "tool": "pay",
                "status": status,
                "original_arguments": {"amount": 120},
                "arguments": {"amount": 100} if approved else {"amount": 120},
                "message": "" if approved or status == "waiting" else "no",
                "permit_id": "permit_5" if approved else None,
            },
        )

    return answer


def test_without_a_pushed_frame_the_wait_polls_the_approval(
    client: SafestopClient, api: FakeApi
) -> None:
    api.overrides[APPROVAL_PATH] = approval_answers("waiting", "waiting", "approved")
    with leased(client, approval_poll_interval=0.02) as run:
        with run.tool_call(
            "pay", {"amount": 120}, side_effect="write", tool_call_id="call_pay"
        ) as call:
            assert call.arguments == {"amount": 100}
            call.result = "paid"
    assert len(api.sent(APPROVAL_PATH)) == 3
    assert call.permit["permit_id"] == "permit_5"
    assert results_for(api, "call_pay")[0]["execution_state"] == "succeeded"


def test_polling_survives_a_server_that_does_not_answer(
    client: SafestopClient, api: FakeApi
) -> None:
    failures = iter([httpx.ConnectError("down"), None])

    def flaky(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        error = next(failures, None)
        if error is not None:
            raise error
        return approval_answers("rejected")(request, body)

    api.overrides[APPROVAL_PATH] = flaky
    with leased(client, approval_poll_interval=0.02) as run:
        with pytest.raises(ApprovalRejected) as caught:
            with run.tool_call("pay", {}, side_effect="write", tool_call_id="call_pay"):
                pytest.fail("must not run")  # pragma: no cover
    assert (caught.value.status, caught.value.message) == ("rejected", "no")


def test_a_202_for_an_approval_already_decided_is_checked_at_once(
    client: SafestopClient, api: FakeApi
) -> None:
    """A retried permit may find its approval decided: the GET is asked without waiting."""
    api.overrides["permits/"] = lambda request, body: waiting_permit(
        request, body, approval={"id": "appr_1", "status": "approved"}
    )
    api.overrides[APPROVAL_PATH] = approval_answers("approved")
    started = time.monotonic()
    with leased(client) as run, run.tool_call("pay", {}, tool_call_id="call_pay") as call:
        call.result = "ok"
    assert time.monotonic() - started < 5, "no poll interval was waited"
    assert call.arguments == {"amount": 100}


@pytest.mark.parametrize("arguments", ["absent", None])
def test_a_pushed_approval_without_arguments_takes_them_from_the_approval(
    client: SafestopClient, api: FakeApi, arguments: Any
) -> None:
    api.overrides[APPROVAL_PATH] = approval_answers("approved")
    frame = decided("approve", permit_id="permit_5", arguments=arguments)
    if arguments == "absent":
        del frame["arguments"]
    with leased(client) as run:
        decide_later(run, api, lambda: run.handle_push_frame(frame))
        with run.tool_call("pay", {"amount": 120}, tool_call_id="call_pay") as call:
            call.result = "ok"
    assert call.arguments == {"amount": 100}
    assert len(api.sent(APPROVAL_PATH)) == 1


def test_a_decision_heard_before_anyone_waits_is_kept(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    runs: list[AgentRun] = []

    def permit_decided_at_once(request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        runs[0].handle_push_frame(decided("approve", arguments={"n": 2}, permit_id="p2"))
        return waiting_permit(request, body)

    fake_api.overrides["permits/"] = permit_decided_at_once
    with leased(client) as run:
        runs.append(run)
        with run.tool_call("pay", {"n": 1}, tool_call_id="call_pay") as call:
            call.result = "ok"
    assert call.arguments == {"n": 2}


# -- the outbox ---------------------------------------------------------------------------


def test_an_outbox_item_awaiting_approval_is_returned_as_is_and_can_be_waited_for(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    answer = {
        "id": "outbox_7",
        "status": "awaiting_approval",
        "idempotency_key": "k7",
        "approval": {"id": "appr_1", "status": "waiting", "deadline": "soon", "rule": "email"},
    }
    fake_api.overrides["outbox/"] = lambda request, body: httpx.Response(201, json=answer)
    with leased(client) as run:
        item = run.enqueue_outbox(
            "webhook",
            "http://hooks.local/mail",
            {"to": "customer"},
            idempotency_key="k7",
            needs_approval=True,
            summary="Email the customer",
            risk="medium",
        )
        assert item == answer
        decide_later(
            run,
            fake_api,
            lambda: run.handle_push_frame(decided("reject", message="tone")),
            after="outbox/",
        )
        decision = run.wait_for_approval(item["approval"]["id"], timeout=5)
    assert (decision.status, decision.message) == ("rejected", "tone")
    (sent,) = fake_api.sent("outbox/")
    assert (sent["needs_approval"], sent["summary"], sent["risk"]) == (
        True,
        "Email the customer",
        "medium",
    )


def test_wait_for_approval_can_time_out_and_ends_on_a_stop(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    with leased(client) as run:
        with pytest.raises(TimeoutError):
            run.wait_for_approval("appr_1", timeout=0.05)
        threading.Timer(0.05, lambda: run.token.cancel("user_stop", stop_epoch=4)).start()
        with pytest.raises(Cancelled):
            run.wait_for_approval("appr_1")


# -- the push socket ----------------------------------------------------------------------


@pytest.fixture
def push_server() -> Iterator[tuple[int, threading.Event, list[str]]]:
    """A push channel that sends an `approval.decided` frame when `go` is set."""
    go = threading.Event()
    frames = [json.dumps({"type": "hello"})]

    def handler(connection: ServerConnection) -> None:
        go.wait(5)
        for frame in frames:
            connection.send(frame)
        try:
            connection.recv(timeout=5)
        except Exception:
            return

    server = serve(handler, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.socket.getsockname()[1], go, frames
    server.shutdown()


def test_a_decision_pushed_on_the_agent_socket_releases_the_call(
    fake_api: FakeApi, push_server: tuple[int, threading.Event, list[str]]
) -> None:
    port, go, frames = push_server
    frames.append(json.dumps(decided("approve", arguments={"amount": 5}, permit_id="p5")))
    fake_api.overrides["permits/"] = waiting_permit
    api = SafestopClient(
        f"http://127.0.0.1:{port}", "tok", transport=httpx.MockTransport(fake_api.handle)
    )
    try:
        with AgentRun(api, "run_1", "w", ttl_seconds=60, approval_poll_interval=60) as run:
            assert run._listener is not None and run._listener.connected.wait(5)
            decide_later(run, fake_api, go.set)
            started = time.monotonic()
            with run.tool_call("pay", {"amount": 50}, tool_call_id="call_pay") as call:
                call.result = "ok"
            waited = time.monotonic() - started
        assert call.arguments == {"amount": 5}
        assert waited < 5 and fake_api.sent(APPROVAL_PATH) == []
    finally:
        api.disconnect()


# -- the pieces ---------------------------------------------------------------------------


def test_frames_and_approvals_become_decisions() -> None:
    frame = decision_from_frame(decided("approve", arguments={"a": 1}, permit_id="p"))
    assert frame is not None
    assert (frame.status, frame.arguments, frame.permit_id) == ("approved", {"a": 1}, "p")
    assert decision_from_frame({"type": "cancel_requested"}) is None
    assert decision_from_frame(decided("maybe")) is None
    assert decision_from_approval({"id": "a", "status": "waiting"}) is None
    expired = decision_from_approval({"id": "a", "status": "expired", "message": "late"})
    assert expired is not None and expired.status == "expired" and expired.arguments is NOT_GIVEN


def test_the_board_keeps_the_first_decision_and_forgets_the_oldest() -> None:
    board = ApprovalBoard(keep=2)
    woken: list[int] = []
    forget = board.on_post(lambda: woken.append(1))
    for approval_id, decision in [
        ("a", "approve"),
        ("a", "reject"),
        ("b", "reject"),
        ("c", "expire"),
    ]:
        parsed = decision_from_frame(decided(decision, approval_id=approval_id))
        assert parsed is not None
        board.post(parsed)
    forget()
    assert board.get("a") is None, "only the latest `keep` are kept"
    assert [board.get(x).status for x in "bc"] == ["rejected", "expired"]  # type: ignore[union-attr]
    assert len(woken) == 4


def test_a_cancel_callback_runs_once_and_at_once_when_already_cancelled() -> None:
    token = CancelToken()
    calls: list[str] = []
    forget = token.on_cancel(lambda: calls.append("first"))
    token.on_cancel(lambda: calls.append("second"))()  # unregistered at once
    token.cancel("user_stop")
    token.cancel("again")
    forget()
    token.on_cancel(lambda: calls.append("late"))
    assert calls == ["first", "late"]


# -- a permit asked again (a retry after a lost answer) ----------------------------------


def test_a_permit_granted_after_approval_carries_the_approved_arguments(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    fake_api.overrides["permits/"] = lambda request, body: httpx.Response(
        201,
        json={
            "permit_id": "permit_3",
            "tool_call_id": body["tool_call_id"],
            "epoch": 3,
            "arguments": {"amount": 10},
            "approval": {"id": "appr_1", "status": "approved"},
        },
    )
    with leased(client) as run, run.tool_call("pay", {"amount": 99}, tool_call_id="c") as call:
        assert call.arguments == {"amount": 10}
        call.result = "ok"
    assert call.original_arguments == {"amount": 99}


def test_a_permit_asked_again_after_a_rejection_raises_approval_rejected(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    fake_api.overrides["permits/"] = lambda request, body: httpx.Response(
        409,
        json={
            "error": "approval_closed",
            "detail": "the approval was rejected",
            "approval": {"id": "appr_1", "status": "rejected", "message": "not this customer"},
        },
    )
    with leased(client) as run:
        with pytest.raises(ApprovalRejected) as caught:
            with run.tool_call("pay", {}, side_effect="write", tool_call_id="call_pay"):
                pytest.fail("must not run")  # pragma: no cover
    assert (caught.value.status, caught.value.message) == ("rejected", "not this customer")
    assert results_for(fake_api, "call_pay") == []
    assert not run.token.cancelled
