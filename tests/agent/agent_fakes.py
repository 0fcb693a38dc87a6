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
