"""The gateway's database work, synchronous (called through `database_sync_to_async`).

Every write is a `runs.services` function: the gateway is a worker like any other — it leases
the run, asks permits, reports results, and drains with observations after a stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.ratelimit import bearer_failure_record, bearer_guessing_wait
from gateway import services as gateway_services
from gateway.models import McpUpstream, Transport
from gateway.secrets import unseal
from runs import services
from runs.actors import Actor
from runs.models import ApiToken, Approval, Run, StopRequest, TokenRole
from runs.services import validate_outbox_destination
from runs.tokens import api_token_authenticate


@dataclass(frozen=True)
class Caller:
    token: ApiToken
    actor: Actor


@dataclass(frozen=True)
class AuthAnswer:
    caller: Caller | None
    status: int = 200
    detail: str = ""
    retry_after: float | None = None


def authenticate(header: str, client_ip: str) -> AuthAnswer:
    """The agent's bearer token, with the same guessing throttle as the HTTP API."""
    wait = bearer_guessing_wait(client_ip=client_ip)
    if wait is not None:
        return AuthAnswer(None, 429, "too many wrong bearer tokens from this address", wait)
    parts = header.split()
    token = None
    if len(parts) == 2 and parts[0].lower() == "bearer":
        token = api_token_authenticate(parts[1])
    if token is None:
        wait = bearer_failure_record(client_ip=client_ip)
        if wait is not None:
            return AuthAnswer(None, 429, "too many wrong bearer tokens from this address", wait)
        return AuthAnswer(None, 401, "Authorization must be 'Bearer <agent token>' of a live token")
    if token.role not in (TokenRole.AGENT, TokenRole.REVIEWER):
        return AuthAnswer(None, 403, "this token may not do work")
    return AuthAnswer(Caller(token=token, actor=Actor.for_token(token)))


@dataclass(frozen=True)
class UpstreamConfig:
    id: int
    name: str
    transport: str
    command: str
    args: list[str]
    env: dict[str, str]
    url: str
    headers: dict[str, str]


def upstream_for(team_id: int, name: str) -> UpstreamConfig | None:
    upstream = McpUpstream.objects.filter(team_id=team_id, name=name, enabled=True).first()
    if upstream is None:
        return None
    if upstream.transport == Transport.HTTP:
        # Checked again at every connect, like a webhook at send: an allow-list narrowed since
        # the upstream was registered applies at once.
        validate_outbox_destination("webhook", upstream.url)
    return UpstreamConfig(
        id=upstream.pk,
        name=upstream.name,
        transport=upstream.transport,
        command=upstream.command,
        args=list(upstream.args),
        env=unseal(upstream.env_sealed),
        url=upstream.url,
        headers=unseal(upstream.headers_sealed),
    )


@dataclass(frozen=True)
class Opened:
    run_id: str
    lease_token: str
    epoch: int


def open_run(
    *,
    caller: Caller,
    session_id: str,
    upstream_id: int,
    title: str,
    agent: str,
    client_name: str,
    client_version: str,
    attach_run_id: str,
    ttl_seconds: float,
) -> Opened:
    """Create the session's run (or take the one named by `Safestop-Run-Id`) and lease it."""
    if attach_run_id:
        run = Run.objects.filter(pk=attach_run_id, team_id=caller.token.team_id).first()
        if run is None:
            raise LookupError(f"no run {attach_run_id[:40]!r} for this token's team")
        run_id = run.pk
    else:
        run_id = services.run_create(
            team=caller.token.team, title=title, agent=agent, actor=caller.actor
        ).pk
    lease = services.lease_acquire(
        run_id=run_id,
        worker_id=f"mcp-gateway:{session_id[:12]}",
        ttl_seconds=ttl_seconds,
        actor=caller.actor,
    )
    upstream = McpUpstream.objects.get(pk=upstream_id)
    gateway_services.session_opened(
        public_id=session_id,
        run_id=run_id,
        upstream=upstream,
        client_name=client_name,
        client_version=client_version,
        token_name=caller.token.name,
    )
    return Opened(run_id=run_id, lease_token=lease.token, epoch=lease.epoch)


@dataclass(frozen=True)
class StopFacts:
    requested_by: str
    reason: str
    note: str
    takeover: bool


def stop_facts(run_id: str) -> StopFacts | None:
    stop = StopRequest.objects.filter(run_id=run_id).order_by("-epoch_after").first()
    if stop is None:
        return None
    return StopFacts(
        requested_by=stop.requested_by, reason=stop.reason, note=stop.note, takeover=stop.takeover
    )


def approval_state(approval_id: int) -> dict[str, Any] | None:
    """The fallback read of a decision, should its push be lost."""
    approval = Approval.objects.filter(pk=approval_id).first()
    if approval is None or approval.status == "waiting":
        return None
    return {"status": approval.status, "arguments": approval.arguments, "message": approval.message}


def run_status(run_id: str) -> str:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first() or ""
