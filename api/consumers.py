"""The agent's push channel: `/ws/agent/runs/<run_id>/` (DESIGN §5).

A worker connects with its bearer token (`Authorization: Bearer ...` header, or `?token=`
for clients that cannot set headers) and no Origin — agents are not browsers; the token is
what authorises them, per run. The socket carries the stop signal, the moment the
stop commits (`runs.notify.stop_signal` → `console.realtime` with `api.agent_sends` → group
`agent_<run_id>`).

Frames sent:
- `{"type": "cancel_requested", "reason", "requested_by", "stop_epoch", "stop_request_id",
  "requested_at", "run_id"}` — on a stop, and at once on connect if the run is already
  stopping or stopped (a worker that reconnects must not miss it);
- `{"type": "approval.decided", "approval_id", "tool_call_id", "outbox_id", "decision",
  "status", "arguments", "message", "permit_id", "epoch", "run_id"}` — the moment a decision on
  one of the run's approvals commits (approve, reject, expire, void; DESIGN §10). Not replayed
  on connect: a worker that reconnects reads the approval (`GET /api/v1/approvals/{id}/`);
- `{"type": "ack", "status", "stop_epoch"}` after the worker's `{"type": "ack"}`;
- `{"type": "pong"}`, `{"type": "error", "error", "detail"}`.

Refusals: the socket is accepted and closed at once with a code a client can read —
4401 no, unknown or revoked token (and at once, while open, when the token is revoked:
a revoked worker neither hears the next stop nor moves the run with an `ack`, which re-checks
the token); 4404 no such run *or another team's run* (like the HTTP
API's 404, so a token cannot probe other teams' run ids); 4429 too many wrong tokens from this
address (`api.ratelimit`: a wrong token here counts against the same per-address budget as
a wrong bearer token over HTTP, and once it is spent every handshake from the address is
refused, the right token too, before any token lookup, until the window ends — the HTTP 429's
`Retry-After`). All are counted as denials (`throttled` for 4429, in `/metrics`).

ORM work only through `database_sync_to_async`; the consumer calls services, never models.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import timezone

from api.permissions import plausible_run_id
from api.ratelimit import bearer_failure_record, bearer_guessing_wait, denial_record
from api.selectors import current_stop_signal
from runs import services
from runs.actors import Actor
from runs.errors import DomainError
from runs.groups import agent_group, token_group
from runs.models import ApiToken, Run
from runs.tokens import api_token_authenticate

CLOSE_BAD_TOKEN = 4401
CLOSE_NO_SUCH_RUN = 4404
CLOSE_TOKEN_GUESSING = 4429
ROUTE = "ws/agent/runs/<run_id>/"

# Deliveries being recorded after their grace (a reference each, so none is collected early).
_RECORDING: set[asyncio.Future[None]] = set()

# The same logger and level as a refused HTTP request (api.errors): one line, no traceback.
refusals = logging.getLogger("safestop.refusals")


@dataclass(frozen=True)
class Verdict:
    token: ApiToken | None
    close_code: int | None


def _guessing_refused(client_ip: str, wait: float) -> Verdict:
    denial_record(
        reason="throttled",
        client_ip=client_ip,
        route=ROUTE,
        detail="agent websocket: too many wrong bearer tokens from this address",
    )
    refusals.warning(
        "refused 4429 websocket %s: rate_limited (too many wrong bearer tokens; retry after "
        "%.0f s) by %s",
        ROUTE,
        wait,
        client_ip or "unknown address",
    )
    return Verdict(None, CLOSE_TOKEN_GUESSING)


def _authorise(raw_token: str, run_id: str, client_ip: str) -> Verdict:
    # A blocked address learns nothing, not even whether this token is right (as over HTTP).
    wait = bearer_guessing_wait(client_ip=client_ip)
    if wait is not None:
        return _guessing_refused(client_ip, wait)
    token = api_token_authenticate(raw_token) if raw_token else None
    if token is None:
        wait = bearer_failure_record(client_ip=client_ip) if raw_token else None
        if wait is not None:
            return _guessing_refused(client_ip, wait)
        denial_record(
            reason="bad_token",
            credential="missing" if not raw_token else "unknown",
            client_ip=client_ip,
            route=ROUTE,
            detail="agent websocket: no valid token",
        )
        return Verdict(None, CLOSE_BAD_TOKEN)
    team_id = (
        Run.objects.filter(pk=run_id).values_list("team_id", flat=True).first()
        if plausible_run_id(run_id)
        else None
    )
    if team_id is None:
        return Verdict(token, CLOSE_NO_SUCH_RUN)
    if team_id != token.team_id:
        denial_record(
            reason="wrong_team",
            team_slug=token.team.slug,
            credential=f"token:{token.name}",
            client_ip=client_ip,
            route=ROUTE,
            detail=f"agent websocket: run {run_id} of another team",
        )
        return Verdict(token, CLOSE_NO_SUCH_RUN)
    return Verdict(token, None)


def _acknowledge_if_token_active(
    token: ApiToken | None, run_id: str, delivered: services.SignalDelivery | None
) -> Run | None:
    """The worker's ack moves the run, so the token is re-checked first, in the same DB hop."""
    if token is None or not ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).exists():
        return None
    return services.run_acknowledge_stop(
        run_id=run_id, actor=Actor.for_token(token), via="websocket", delivered=delivered
    )


def _token_from_scope(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() == "bearer":
                return parts[1]
            return ""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    return (query.get("token") or [""])[0]


# How long a signal's delivery waits for the worker's ack to record it. Both SDKs ack at once,
# so the ack records it in its own transaction; a worker that does not is recorded after this.
DELIVERY_RECORD_GRACE_SECONDS = 0.5


class AgentRunConsumer(AsyncJsonWebsocketConsumer):
    run_id: str = ""
    group: str = ""
    token_group: str = ""
    token: ApiToken | None = None
    # The signal written to this socket whose delivery is not recorded yet, and its timer.
    unrecorded: services.SignalDelivery | None = None
    record_timer: asyncio.TimerHandle | None = None

    async def connect(self) -> None:
        self.run_id = str(self.scope["url_route"]["kwargs"]["run_id"])
        client = self.scope.get("client") or ("", 0)
        verdict = await database_sync_to_async(_authorise)(
            _token_from_scope(self.scope), self.run_id, str(client[0])
        )
        if verdict.close_code is not None:
            await self.accept()
            await self.close(code=verdict.close_code)
            return
        self.token = verdict.token
        # Join the token's group first: a revocation that commits from here on closes us.
        self.token_group = token_group(self.token.pk)
        await self.channel_layer.group_add(self.token_group, self.channel_name)
        # Join the group before reading the run's state: a stop that commits in between is then
        # either seen in the state or pushed to the group — never missed.
        self.group = agent_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        signal, stopping = await database_sync_to_async(current_stop_signal)(run_id=self.run_id)
        await self.accept()
        if signal is not None:
            await self._deliver(signal, record=stopping)

    async def disconnect(self, code: int) -> None:
        await self._record_delivery()
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self.token_group:
            await self.channel_layer.group_discard(self.token_group, self.channel_name)

    async def token_revoked(self, event: dict[str, Any]) -> None:
        """The token was revoked while this socket was open: close at once (4401)."""
        await self.close(code=CLOSE_BAD_TOKEN)

    async def stop_signal(self, event: dict[str, Any]) -> None:
        """Group message (`api.agent_sends`) once a stop of this run committed."""
        await self._deliver(event["signal"], record=True)

    async def approval_decided(self, event: dict[str, Any]) -> None:
        """Group message once a decision on one of this run's approvals committed."""
        await self.send_json({**event["decision"], "run_id": self.run_id})

    async def _deliver(self, signal: dict[str, Any], *, record: bool) -> None:
        await self.send_json({**signal, "type": "cancel_requested", "run_id": self.run_id})
        if record:
            # Not recorded here, in a transaction of its own: the worker's ack, a few
            # milliseconds behind, records it (`run_acknowledge_stop`). This one would sit on
            # this socket's database thread ahead of the ack, and the worker's drained answer
            # waits for the ack's run lock.
            await self._record_delivery()  # an earlier signal's, if still pending
            self.unrecorded = services.SignalDelivery(
                stop_epoch=int(signal["stop_epoch"]), at=timezone.now()
            )
            self.record_timer = asyncio.get_running_loop().call_later(
                DELIVERY_RECORD_GRACE_SECONDS, self._record_delivery_soon
            )

    def _record_delivery_soon(self) -> None:
        self.record_timer = None
        if self.unrecorded is not None:
            recording = asyncio.ensure_future(self._record_delivery())
            _RECORDING.add(recording)
            recording.add_done_callback(_RECORDING.discard)

    def _take_delivery(self) -> services.SignalDelivery | None:
        """The pending delivery, for the caller to record."""
        if self.record_timer is not None:
            self.record_timer.cancel()
            self.record_timer = None
        delivered, self.unrecorded = self.unrecorded, None
        return delivered

    async def _record_delivery(self, delivered: services.SignalDelivery | None = None) -> None:
        """Record the pending delivery now (no ack came, or the socket closes)."""
        delivered = delivered or self._take_delivery()
        if delivered is not None:
            await database_sync_to_async(services.stop_signal_delivered)(
                run_id=self.run_id, stop_epoch=delivered.stop_epoch, at=delivered.at
            )

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        try:
            content = json.loads(text_data if text_data is not None else (bytes_data or b""))
        except (ValueError, RecursionError):
            await self._error("invalid_json", "frames are JSON objects")
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "ack":
            delivered = self._take_delivery()
            try:
                run = await database_sync_to_async(_acknowledge_if_token_active)(
                    self.token, self.run_id, delivered
                )
            except DomainError as error:
                await self._record_delivery(delivered)
                await self._error(error.code, error.detail)
                return
            if run is None:
                await self._record_delivery(delivered)
                # Revoked (or expired) since connect, and the revocation's message has not
                # reached us yet: a state change needs a live token, so nothing moved.
                await self.close(code=CLOSE_BAD_TOKEN)
                return
            await self.send_json(
                {"type": "ack", "status": run.status, "stop_epoch": run.stop_epoch}
            )
        elif kind == "ping":
            await self.send_json({"type": "pong"})
        else:
            await self._error("unknown_frame", 'send {"type": "ack"} or {"type": "ping"}')

    async def _error(self, code: str, detail: str) -> None:
        await self.send_json({"type": "error", "error": code, "detail": detail})
