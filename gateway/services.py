"""Registering upstreams: validate, seal the secrets, write the ledger entry in one transaction.

An HTTP upstream's URL follows the webhook rule (`SAFESTOP_WEBHOOK_ALLOWED_HOSTS`): the gateway
contacts only hosts an operator allowed, whoever registers the upstream.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import transaction
from django.utils import timezone

from gateway.models import McpSession, McpUpstream, Transport
from gateway.secrets import seal
from runs.actors import Actor
from runs.errors import InvalidInput, NotFound
from runs.ledger import ledger_append
from runs.models import Team
from runs.services import validate_outbox_destination

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# An env name or header name as the operating system and HTTP accept them.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
# Hop-by-hop or gateway-owned headers an upstream registration may not set.
_RESERVED_HEADERS = {
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "mcp-session-id",
    "mcp-protocol-version",
}


def _str_map(value: Any, *, field: str, name_pattern: re.Pattern[str]) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{field} must be an object of strings", field=field)
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not name_pattern.match(key):
            raise InvalidInput(f"{field}: {str(key)[:40]!r} is not a valid name", field=field)
        if not isinstance(item, str) or len(item) > 8192 or any(c in item for c in "\r\n\x00"):
            raise InvalidInput(
                f"{field}.{key} must be a string of at most 8192 characters, one line",
                field=field,
            )
        out[key] = item
    return out


def _args(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise InvalidInput("args must be a list of strings", field="args")
    if len(value) > 100 or any(len(a) > 4096 or "\x00" in a for a in value):
        raise InvalidInput("args: at most 100 strings of at most 4096 characters", field="args")
    return list(value)


def upstream_create(
    *,
    team: Team,
    name: str,
    transport: str,
    actor: Actor,
    command: str = "",
    args: Any = None,
    env: Any = None,
    url: str = "",
    headers: Any = None,
) -> McpUpstream:
    """Register an upstream MCP server for `team` under `name` (reached at `/mcp/<name>/`)."""
    fields = upstream_validate(
        name=name,
        transport=transport,
        command=command,
        args=args,
        env=env,
        url=url,
        headers=headers,
    )
    with transaction.atomic():
        if McpUpstream.objects.filter(team=team, name=name).exists():
            raise InvalidInput(
                f"team {team.slug} already has an upstream named {name!r}", field="name"
            )
        upstream = McpUpstream.objects.create(
            team=team, name=name, transport=transport, created_by=actor.name, **fields
        )
        ledger_append(
            run=None,
            actor=actor,
            action="mcp.upstream_created",
            team_slug=team.slug,
            payload={
                "name": name,
                "transport": transport,
                "command": upstream.command,
                "url": upstream.url,
                "env_names": upstream.env_names,
                "header_names": upstream.header_names,
            },
        )
    return upstream


def upstream_validate(
    *,
    name: str,
    transport: str,
    command: str = "",
    args: Any = None,
    env: Any = None,
    url: str = "",
    headers: Any = None,
) -> dict[str, Any]:
    """The model fields of a registration (secrets sealed), or `InvalidInput` naming the field."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise InvalidInput(
            "name must be 1-64 lowercase letters, digits, '-' or '_' (it is the URL path)",
            field="name",
        )
    if transport not in Transport.values:
        raise InvalidInput(
            f"transport must be one of {', '.join(Transport.values)}", field="transport"
        )
    fields: dict[str, Any] = {}
    if transport == Transport.STDIO:
        if url or headers:
            raise InvalidInput("a stdio upstream takes command, args and env", field="url")
        if not isinstance(command, str) or not command.strip() or len(command) > 500:
            raise InvalidInput("command is required (at most 500 characters)", field="command")
        env_map = _str_map(env, field="env", name_pattern=_ENV_NAME)
        fields = {
            "command": command,
            "args": _args(args),
            "env_names": sorted(env_map),
            "env_sealed": seal(env_map),
        }
    else:
        if command or args or env:
            raise InvalidInput("an http upstream takes url and headers", field="command")
        if not isinstance(url, str) or not url:
            raise InvalidInput("url is required", field="url")
        try:
            validate_outbox_destination("webhook", url)
        except InvalidInput as error:
            raise InvalidInput(
                "url is not an http(s) URL on SAFESTOP_WEBHOOK_ALLOWED_HOSTS", field="url"
            ) from error
        header_map = _str_map(headers, field="headers", name_pattern=_HEADER_NAME)
        reserved = sorted(h for h in header_map if h.lower() in _RESERVED_HEADERS)
        if reserved:
            raise InvalidInput(
                f"headers: {', '.join(reserved)} is set by the gateway", field="headers"
            )
        fields = {
            "url": url,
            "header_names": sorted(header_map),
            "headers_sealed": seal(header_map),
        }
    return fields


def upstream_update(
    *,
    upstream_id: int,
    team_ids: list[int] | None,
    actor: Actor,
    command: str = "",
    args: Any = None,
    env: Any = None,
    url: str = "",
    headers: Any = None,
    enabled: bool = True,
) -> McpUpstream:
    """Change an upstream's command, args, URL or enabled flag (its team, name and transport
    stay). `env` / `headers` None keeps the sealed secrets; a map replaces them. Sessions
    already open keep their connection; the next `initialize` uses the new settings."""
    with transaction.atomic():
        query = McpUpstream.objects.select_for_update().select_related("team")
        if team_ids is not None:
            query = query.filter(team_id__in=team_ids)
        upstream = query.filter(pk=upstream_id).first()
        if upstream is None:
            raise NotFound(f"no upstream {upstream_id}")
        fields = upstream_validate(
            name=upstream.name,
            transport=upstream.transport,
            command=command,
            args=args,
            env=env or {},
            url=url,
            headers=headers or {},
        )
        replaced = []
        if upstream.transport == Transport.STDIO:
            if env is None:
                del fields["env_names"], fields["env_sealed"]
            else:
                replaced.append("env")
        elif headers is None:
            del fields["header_names"], fields["headers_sealed"]
        else:
            replaced.append("headers")
        for name, value in fields.items():
            setattr(upstream, name, value)
        upstream.enabled = bool(enabled)
        upstream.save()
        ledger_append(
            run=None,
            actor=actor,
            action="mcp.upstream_updated",
            team_slug=upstream.team.slug,
            payload={
                "name": upstream.name,
                "command": upstream.command,
                "args": upstream.args,
                "url": upstream.url,
                "env_names": upstream.env_names,
                "header_names": upstream.header_names,
                "enabled": upstream.enabled,
                "secrets_replaced": replaced,
            },
        )
    return upstream


def upstream_delete(*, upstream_id: int, team_ids: list[int] | None, actor: Actor) -> None:
    with transaction.atomic():
        query = McpUpstream.objects.select_related("team").filter(pk=upstream_id)
        if team_ids is not None:
            query = query.filter(team_id__in=team_ids)
        upstream = query.first()
        if upstream is None:
            raise NotFound(f"no upstream {upstream_id}")
        ledger_append(
            run=None,
            actor=actor,
            action="mcp.upstream_deleted",
            team_slug=upstream.team.slug,
            payload={"name": upstream.name, "transport": upstream.transport},
        )
        upstream.delete()


def session_opened(
    *,
    public_id: str,
    run_id: str,
    upstream: McpUpstream,
    client_name: str,
    client_version: str,
    token_name: str,
) -> McpSession:
    return McpSession.objects.create(
        public_id=public_id,
        run_id=run_id,
        upstream=upstream,
        upstream_name=upstream.name,
        client_name=client_name[:200],
        client_version=client_version[:100],
        token_name=token_name,
    )


def session_ended(*, public_id: str, reason: str) -> None:
    McpSession.objects.filter(public_id=public_id, ended_at__isnull=True).update(
        ended_at=timezone.now(), end_reason=reason[:64]
    )
