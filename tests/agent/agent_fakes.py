"""A scripted stand-in for the safestop API, for the agent package's own tests.

`FakeApi` answers the wire contract in-process through `httpx.MockTransport`.
It checks only what the agent side is responsible for (which endpoint, which
fields, which epoch); the server's real rules are tested against the real
server elsewhere.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

Responder = Callable[[httpx.Request, dict[str, Any]], httpx.Response | None]


@dataclass
class FakeApi:
    """A scripted server. Tests set `overrides[suffix]` to change one endpoint's answer."""

    epoch: int = 3
    lease_id: str = "lease_tok"
    requests: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    overrides: dict[str, Responder] = field(default_factory=dict)
    heartbeat_signal: dict[str, Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        suffix = request.url.path.split("/runs/run_1/", 1)[-1]
        with self.lock:
            self.requests.append((request.method, suffix, body))
        override = self.overrides.get(suffix)
        if override is not None:
            answer = override(request, body)
            if answer is not None:
                return answer
        return self.default_answer(suffix, body)

    def default_answer(self, suffix: str, body: dict[str, Any]) -> httpx.Response:
        if suffix == "lease/":
            return httpx.Response(
                200, json={"lease_id": self.lease_id, "epoch": self.epoch, "expires_at": "soon"}
            )
        if suffix == "lease/heartbeat/":
            return httpx.Response(
                200, json={"expires_at": "later", "signal": self.heartbeat_signal}
            )
        if suffix == "permits/":
            return httpx.Response(
                201,
                json={
                    "permit_id": "p1",
                    "tool_call_id": body["tool_call_id"],
                    "epoch": body["epoch"],
                },
            )
        if suffix == "events/":
            results = [{"event_id": e["event_id"], "status": "accepted"} for e in body["events"]]
            return httpx.Response(200, json={"results": results})
        if suffix == "outbox/":
            return httpx.Response(
                201,
                json={
                    "id": "outbox_1",
                    "status": "pending",
                    "idempotency_key": body["idempotency_key"],
                },
            )
        return httpx.Response(200, json={"ok": True})

    def sent(self, suffix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for _method, path, body in self.requests if path == suffix]

    def sent_matching(self, prefix: str) -> list[tuple[str, dict[str, Any]]]:
        with self.lock:
            return [
                (path, body) for _method, path, body in self.requests if path.startswith(prefix)
            ]

    def events_of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [
            e for batch in self.sent("events/") for e in batch["events"] if e["type"] == event_type
        ]


def refusal(code: str, *, status: str = "cancel_requested", stop_epoch: int = 4) -> httpx.Response:
    return httpx.Response(
        409,
        json={
            "error": code,
            "detail": f"refused: {code}",
            "status": status,
            "stop_epoch": stop_epoch,
        },
    )


class ApprovalServer:
    """Permits for tools in `held` answer 202 until `decide()`; then the decision."""

    def __init__(self, api: FakeApi, held: set[str]) -> None:
        self.api = api
        self.held = held
        self.decision: dict[str, Any] | None = None
        self.asked: list[dict[str, Any]] = []
        api.overrides["permits/"] = self.permit
        api.overrides["/api/v1/approvals/appr_1/"] = self.get_approval

    def permit(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response | None:
        if body["tool"] not in self.held:
            return None
        self.asked.append(body)
        approval = {"id": "appr_1", "status": "waiting", "deadline": "soon"}
        if self.decision is None:
            answer = {"tool_call_id": body["tool_call_id"], "epoch": body["epoch"]}
            return httpx.Response(202, json={**answer, "approval": approval})
        if self.decision["status"] != "approved":
            closed = {**approval, **self.decision}
            return httpx.Response(
                409, json={"error": "approval_closed", "detail": "no", "approval": closed}
            )
        return httpx.Response(
            200,
            json={
                "permit_id": "permit_9",
                "tool_call_id": body["tool_call_id"],
                "epoch": body["epoch"],
                "approval": {**approval, "status": "approved"},
                "arguments": self.decision["arguments"],
            },
        )

    def get_approval(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        if self.decision is None:
            return httpx.Response(200, json={"id": "appr_1", "status": "waiting"})
        return httpx.Response(200, json={"id": "appr_1", "permit_id": "permit_9", **self.decision})

    def decide(self, status: str, *, arguments: Any = None, message: str = "") -> None:
        self.decision = {"status": status, "arguments": arguments, "message": message}
