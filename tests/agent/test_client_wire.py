"""Client-side wire mechanics only: headers, paths, error mapping, push channel.

A tiny local HTTP server and a tiny websocket server stand in for safestop.
The server's behaviour is tested end-to-end against the real server elsewhere.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from agent_fakes import FakeApi
from websockets.sync.server import Server, ServerConnection, serve

from safestop_agent import AgentRun, ApiError, Refused, SafestopClient, ToolCallConflict
from safestop_agent.signals import stop_signal_in
from safestop_agent.wire import error_from_response
from tests.support.waiting import wait_until


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class TinyServer:
    url: str
    seen: list[Recorded] = field(default_factory=list)
    # path -> (status, body as bytes)
    answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)


@pytest.fixture
def tiny_server() -> Iterator[TinyServer]:
    state = TinyServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            state.seen.append(
                Recorded(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    json.loads(raw) if raw else None,
                )
            )
            status, body = state.answers.get(self.path.split("?")[0], (200, b'{"ok": true}'))
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _answer
        do_POST = _answer

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
    )
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def test_every_request_carries_the_bearer_token_and_json(tiny_server: TinyServer) -> None:
    with SafestopClient(tiny_server.url, "tok-123") as api:
        api.create_run("Refund triage", "support-bot", budget={"max_tool_calls": 5})
        api.get_run("run_1")
        api.list_runs(status="running")
    create, detail, listing = tiny_server.seen
    assert all(r.headers["authorization"] == "Bearer tok-123" for r in tiny_server.seen)
    assert (create.method, create.path) == ("POST", "/api/v1/runs/")
    assert create.body == {
        "title": "Refund triage",
        "agent": "support-bot",
        "budget": {"max_tool_calls": 5},
    }
    assert create.headers["content-type"] == "application/json"
    assert (detail.method, detail.path) == ("GET", "/api/v1/runs/run_1/")
    assert listing.path == "/api/v1/runs/?status=running"


@pytest.mark.parametrize(
    ("call", "method", "path"),
    [
        (lambda a: a.acquire_lease("r", "w", 30), "POST", "/api/v1/runs/r/lease/"),
        (
            lambda a: a.heartbeat("r", lease_id="l", epoch=1),
            "POST",
            "/api/v1/runs/r/lease/heartbeat/",
        ),
        (
            lambda a: a.release_lease("r", lease_id="l", epoch=1),
            "POST",
            "/api/v1/runs/r/lease/release/",
        ),
        (
            lambda a: a.request_permit(
                "r", epoch=1, tool_call_id="c", tool="t", side_effect="none", arguments={}
            ),
            "POST",
            "/api/v1/runs/r/permits/",
        ),
        (
            lambda a: a.report_tool_result("r", "call/9", execution_state="unknown"),
            "POST",
            "/api/v1/runs/r/tool-calls/call%2F9/result/",
        ),
        (lambda a: a.send_events("r", epoch=1, events=[]), "POST", "/api/v1/runs/r/events/"),
        (
            lambda a: a.enqueue_outbox(
                "r", epoch=1, transport="webhook", destination="d", payload={}, idempotency_key="k"
            ),
            "POST",
            "/api/v1/runs/r/outbox/",
        ),
        (lambda a: a.drained("r", lease_id="l", epoch=1), "POST", "/api/v1/runs/r/drained/"),
        (lambda a: a.cancel("r", "user_stop"), "POST", "/api/v1/runs/r/cancel/"),
        (lambda a: a.takeover("r"), "POST", "/api/v1/runs/r/takeover/"),
        (lambda a: a.resume("r"), "POST", "/api/v1/runs/r/resume/"),
        (lambda a: a.close("r"), "POST", "/api/v1/runs/r/close/"),
        (lambda a: a.stop_packet("r"), "GET", "/api/v1/runs/r/stop-packet/"),
        (lambda a: a.stop_packet("r", epoch=2), "GET", "/api/v1/runs/r/stop-packets/2/"),
        (
            lambda a: a.resolve("r", target="tool_call", id="c", decision="applied"),
            "POST",
            "/api/v1/runs/r/resolutions/",
        ),
        (lambda a: a.steer("r", "also check EU"), "POST", "/api/v1/runs/r/steering/"),
    ],
)
def test_each_operation_uses_the_documented_path(
    tiny_server: TinyServer, call: Any, method: str, path: str
) -> None:
    with SafestopClient(tiny_server.url + "/", "t") as api:
        call(api)
    (seen,) = tiny_server.seen
    assert (seen.method, seen.path) == (method, path)


def test_a_stop_refusal_raises_refused_with_status_and_epoch(tiny_server: TinyServer) -> None:
    body = {
        "error": "stale_epoch",
        "detail": "run was stopped",
        "status": "cancel_requested",
        "stop_epoch": 6,
    }
    tiny_server.answers["/api/v1/runs/r/permits/"] = (409, json.dumps(body).encode())
    with SafestopClient(tiny_server.url, "t") as api, pytest.raises(Refused) as caught:
        api.request_permit(
            "r", epoch=5, tool_call_id="c", tool="t", side_effect="write", arguments={}
        )
    error = caught.value
    assert (error.status_code, error.code, error.detail) == (409, "stale_epoch", "run was stopped")
    assert (error.run_status, error.stop_epoch) == ("cancel_requested", 6)
    assert error.body == body


def test_lease_held_is_an_api_error_but_not_a_stop_refusal(tiny_server: TinyServer) -> None:
    tiny_server.answers["/api/v1/runs/r/lease/"] = (
        409,
        b'{"error": "lease_held", "detail": "busy"}',
    )
    with SafestopClient(tiny_server.url, "t") as api, pytest.raises(ApiError) as caught:
        api.acquire_lease("r", "w")
    assert not isinstance(caught.value, Refused)
    assert caught.value.code == "lease_held"


def test_a_reused_tool_call_id_raises_tool_call_conflict_naming_the_first_call(
    tiny_server: TinyServer,
) -> None:
    body = {
        "error": "tool_call_conflict",
        "detail": "tool call X1 was first asked for tool 'send_email', not 'lookup'",
        "status": "running",
        "stop_epoch": 1,
        "tool_call_id": "X1",
        "first_tool": "send_email",
        "first_arguments": {"to": "a"},
    }
    tiny_server.answers["/api/v1/runs/r/permits/"] = (409, json.dumps(body).encode())
    with SafestopClient(tiny_server.url, "t") as api, pytest.raises(ToolCallConflict) as caught:
        api.request_permit(
            "r", epoch=1, tool_call_id="X1", tool="lookup", side_effect="none", arguments={}
        )
    error = caught.value
    assert not isinstance(error, Refused)  # not a stop: the run goes on
    assert (error.tool_call_id, error.first_tool, error.first_arguments) == (
        "X1",
        "send_email",
        {"to": "a"},
    )


def test_a_non_json_error_still_maps_to_an_api_error(tiny_server: TinyServer) -> None:
    tiny_server.answers["/api/v1/runs/r/"] = (502, b"<html>bad gateway</html>")
    with SafestopClient(tiny_server.url, "t") as api, pytest.raises(ApiError) as caught:
        api.get_run("r")
    assert (caught.value.status_code, caught.value.code) == (502, "http_502")
    assert caught.value.is_transient
    assert "bad gateway" in caught.value.detail


def test_push_url_follows_the_base_url_scheme_and_prefix() -> None:
    assert (
        SafestopClient("http://h:8000", "t").push_url("run_1") == "ws://h:8000/ws/agent/runs/run_1/"
    )
    assert (
        SafestopClient("https://h/console/", "t").push_url("r")
        == "wss://h/console/ws/agent/runs/r/"
    )


# -- the websocket push --------------------------------------------------------------


@dataclass
class PushServer:
    server: Server
    port: int
    handshakes: list[dict[str, str]] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)


def start_push_server(drop_first_connections: int, frame: dict[str, Any]) -> PushServer:
    """A push channel that drops the first N connections, then pushes `frame`."""
    holder: list[PushServer] = []

    def handler(connection: ServerConnection) -> None:
        state = holder[0]
        assert connection.request is not None
        state.handshakes.append(
            {
                "path": connection.request.path,
                "authorization": connection.request.headers.get("Authorization", ""),
                "origin": connection.request.headers.get("Origin", ""),
            }
        )
        if len(state.handshakes) <= drop_first_connections:
            connection.close()
            return
        connection.send(json.dumps({"type": "hello"}))
        connection.send(json.dumps(frame))
        try:
            state.received.append(json.loads(connection.recv(timeout=5)))
        except Exception:
            return

    server = serve(handler, "127.0.0.1", 0)
    port = server.socket.getsockname()[1]
    holder.append(PushServer(server, port))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return holder[0]


@pytest.mark.parametrize(
    "message",
    [
        {"type": "cancel_requested", "reason": "user_stop", "requested_by": "a", "stop_epoch": 2},
        {
            "type": "stop.signal",
            "run_id": "r",
            "signal": {
                "type": "cancel_requested",
                "reason": "user_stop",
                "requested_by": "a",
                "stop_epoch": 2,
            },
        },
    ],
)
def test_a_stop_is_found_in_a_bare_or_wrapped_frame(message: dict[str, Any]) -> None:
    signal = stop_signal_in(json.dumps(message))
    assert signal is not None and signal["stop_epoch"] == 2


def test_frames_that_are_not_stops_are_ignored() -> None:
    assert stop_signal_in('{"type": "run.updated", "status": "running"}') is None
    assert stop_signal_in("not json") is None
    assert stop_signal_in("[1, 2]") is None


def test_a_pushed_stop_sets_the_token_after_a_reconnect(fake_api: FakeApi) -> None:
    frame = {
        "type": "cancel_requested",
        "reason": "user_stop",
        "requested_by": "alice",
        "stop_epoch": 4,
    }
    push = start_push_server(drop_first_connections=1, frame=frame)
    api = SafestopClient(
        f"http://127.0.0.1:{push.port}", "tok-9", transport=httpx.MockTransport(fake_api.handle)
    )
    try:
        # A long TTL: the heartbeat cannot be the one that delivers this stop.
        with AgentRun(api, "run_1", "w", ttl_seconds=60, push=True) as run:
            assert run.token.wait(5.0), "the pushed frame must set the token"
            listener = run._listener
        assert (run.token.reason, run.token.requested_by, run.token.stop_epoch) == (
            "user_stop",
            "alice",
            4,
        )
        assert len(push.handshakes) == 2, "the dropped connection was retried"
        assert push.handshakes[1] == {
            "path": "/ws/agent/runs/run_1/",
            "authorization": "Bearer tok-9",
            "origin": "",
        }
        assert fake_api.sent("lease/heartbeat/") == []
        assert wait_until(lambda: push.received == [{"type": "ack", "stop_epoch": 4}])
        assert listener is not None and not listener._thread.is_alive(), (
            "the listener stops on exit"
        )
        assert fake_api.sent("drained/")
    finally:
        api.disconnect()
        push.server.shutdown()


# -- pages and refusal codes ---------------------------------------------------------


def paged_runs(total: int, page_size: int) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """A runs list answered the way the server pages it: `{"next", "previous", "results"}`.

    `next` names another host, as it does behind a proxy: only its cursor may be used.
    """
    seen: list[httpx.Request] = []
    runs = [{"id": f"run_{n}", "status": "running"} for n in range(total)]

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        start = int(request.url.params.get("cursor") or 0)
        end = start + page_size
        next_url = (
            f"http://internal:8000/api/v1/runs/?cursor={end}&status=running"
            if end < total
            else None
        )
        return httpx.Response(
            200, json={"next": next_url, "previous": None, "results": runs[start:end]}
        )

    return httpx.MockTransport(handle), seen


def test_list_runs_follows_every_page() -> None:
    transport, seen = paged_runs(total=120, page_size=50)
    with SafestopClient("https://safestop.example/console", "t", transport=transport) as api:
        runs = api.list_runs(status="running", page_size=50)
    assert [run["id"] for run in runs] == [f"run_{n}" for n in range(120)]
    assert [str(request.url) for request in seen] == [
        "https://safestop.example/console/api/v1/runs/?status=running&limit=50",
        "https://safestop.example/console/api/v1/runs/?status=running&limit=50&cursor=50",
        "https://safestop.example/console/api/v1/runs/?status=running&limit=50&cursor=100",
    ]


def test_iter_runs_asks_for_a_page_only_when_it_is_needed() -> None:
    transport, seen = paged_runs(total=120, page_size=50)
    with SafestopClient("http://h", "t", transport=transport) as api:
        first = next(api.iter_runs())
    assert first["id"] == "run_0" and len(seen) == 1


def test_a_next_page_without_a_cursor_is_an_error_not_a_short_list() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"next": "http://h/elsewhere", "results": [{"id": "a"}]})

    with SafestopClient("http://h", "t", transport=httpx.MockTransport(handle)) as api:
        with pytest.raises(ApiError) as caught:
            api.list_runs()
    assert caught.value.code == "bad_page"


def test_a_bare_list_answer_is_one_page() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=[{"id": "a"}, {"id": "b"}])

    with SafestopClient("http://h", "t", transport=httpx.MockTransport(handle)) as api:
        assert [run["id"] for run in api.list_runs()] == ["a", "b"]


def test_iter_ledger_follows_pages_with_the_filters() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.params["run"] == "r1"
        if request.url.params.get("cursor") == "c2":
            return httpx.Response(200, json={"next": None, "results": [{"seq": 1}]})
        return httpx.Response(
            200, json={"next": "http://h/api/v1/ledger/?cursor=c2&run=r1", "results": [{"seq": 2}]}
        )

    with SafestopClient("http://h", "t", transport=httpx.MockTransport(handle)) as api:
        assert [entry["seq"] for entry in api.iter_ledger(run="r1")] == [2, 1]


@pytest.mark.parametrize(
    ("code", "refused"),
    [
        ("stale_epoch", True),
        ("run_not_running", True),
        ("lease_revoked", True),
        ("illegal_transition", True),
        # A team over its daily or monthly budget gets no new permits until an admin raises it.
        ("budget_exhausted", True),
        ("lease_held", False),
    ],
)
def test_which_409_codes_are_refusals(code: str, refused: bool) -> None:
    response = httpx.Response(409, json={"error": code, "detail": "no"})
    assert isinstance(error_from_response(response), Refused) is refused


def test_a_request_after_disconnect_says_so_and_ends_a_heartbeat_quietly() -> None:
    # A heartbeat thread still running when its owner shuts the client down (a simulator's
    # exit) must end, not die with httpx's bare RuntimeError in its thread.
    from safestop_agent.errors import ClientDisconnected
    from safestop_agent.signals import HeartbeatLoop

    client = SafestopClient(
        "http://test", "tok", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={}))
    )
    client.disconnect()
    with pytest.raises(ClientDisconnected):
        client.heartbeat("run_1", lease_id=1, epoch=1)
    lost: list[str] = []
    beats = HeartbeatLoop(
        beat=lambda: client.heartbeat("run_1", lease_id=1, epoch=1),
        interval=60,
        ttl_seconds=30,
        on_signal=lambda signal: None,
        on_lease_lost=lambda code, epoch: lost.append(code),
    )
    assert beats.beat_once() is False
    assert lost == []  # not a lost lease: the owner is gone
