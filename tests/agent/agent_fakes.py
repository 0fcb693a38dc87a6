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


class PermitLedger:
    """Permits as the server keeps them: by `tool_call_id`, each with its approval if held.

    A `tool_call_id` asked again gets what it was first granted (its permit, and once
    approved the reviewer's arguments), whatever it asks for the second time: so a client
    that names two calls alike runs one with the other's permit and arguments, as it did
    against the real server. `conflicts()` lists the ids asked for two different things.
    Tools in `held` wait for a reviewer (`decide`).
    """

    def __init__(self, api: FakeApi, held: set[str]) -> None:
        self.api = api
        self.held = held
        self.lock = threading.Lock()
        self.calls: dict[str, dict[str, Any]] = {}  # tool_call_id → first ask and its grant
        self.asks: dict[str, list[tuple[str, str]]] = {}
        self.approvals: dict[str, dict[str, Any]] = {}
        api.overrides["permits/"] = self.permit

    def permit(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        call_id = body["tool_call_id"]
        with self.lock:
            what = (body["tool"], json.dumps(body["arguments"], sort_keys=True))
            self.asks.setdefault(call_id, []).append(what)
            call = self.calls.get(call_id)
            if call is None:
                call = {"tool": body["tool"], "arguments": body["arguments"], "approval": None}
                call["permit_id"] = f"permit_{len(self.calls) + 1}"
                if body["tool"] in self.held or body.get("needs_approval"):
                    approval_id = f"appr_{len(self.approvals) + 1}"
                    call["approval"] = approval_id
                    self.approvals[approval_id] = {
                        "id": approval_id,
                        "status": "waiting",
                        "tool_call_id": call_id,
                        "tool": body["tool"],
                        "original_arguments": body["arguments"],
                        "arguments": body["arguments"],
                        "message": "",
                    }
                    self.api.overrides[f"/api/v1/approvals/{approval_id}/"] = self.get_approval
                self.calls[call_id] = call
            answer = {"tool_call_id": call_id, "epoch": body["epoch"]}
            if call["approval"] is None:
                return httpx.Response(200, json={**answer, "permit_id": call["permit_id"]})
            approval = dict(self.approvals[call["approval"]])
        if approval["status"] == "waiting":
            return httpx.Response(202, json={**answer, "approval": approval})
        if approval["status"] != "approved":
            return httpx.Response(
                409, json={"error": "approval_closed", "detail": "closed", "approval": approval}
            )
        return httpx.Response(
            200,
            json={
                **answer,
                "permit_id": call["permit_id"],
                "approval": approval,
                "arguments": approval["arguments"],
            },
        )

    def get_approval(self, request: httpx.Request, body: dict[str, Any]) -> httpx.Response:
        approval_id = request.url.path.rstrip("/").rsplit("/", 1)[-1]
        with self.lock:
            approval = dict(self.approvals[approval_id])
        if approval["status"] == "approved":
            approval["permit_id"] = self.calls[approval["tool_call_id"]]["permit_id"]
        return httpx.Response(200, json=approval)

    def waiting(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(a) for a in self.approvals.values() if a["status"] == "waiting"]

    def decide(
        self, approval_id: str, status: str, *, arguments: Any = None, message: str = ""
    ) -> None:
        with self.lock:
            approval = self.approvals[approval_id]
            approval.update(status=status, message=message)
            if arguments is not None:
                approval["arguments"] = arguments

    def conflicts(self) -> dict[str, list[tuple[str, str]]]:
        """The ids asked for more than one (tool, arguments)."""
        with self.lock:
            return {cid: asks for cid, asks in self.asks.items() if len(set(asks)) > 1}
