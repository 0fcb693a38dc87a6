"""Refuse agent clients older than the wire contract this server needs (`426 client_too_old`).

`safestop-agent` names its version on every request (`Safestop-Agent-Version`, and
`User-Agent: safestop-agent/<version>`); the version moves with the wire contract. A client
below `SAFESTOP_MIN_AGENT_VERSION` is answered before anything else happens, with the minimum,
so it fails loudly at its first request instead of half-understanding a newer contract (a
0.1 client would not know that a permit answered 202 has no `permit_id` and must wait).
Requests that name no agent version (curl, the console, other clients) are not checked.
"""

from __future__ import annotations

import os
import re
from typing import Any

from django.conf import settings

from runs.errors import DomainError

# 0.2: permits may answer 202 with an approval to wait for (DESIGN §10).
DEFAULT_MIN_AGENT_VERSION = "0.2.0"

_USER_AGENT = re.compile(r"safestop-agent/(\S+)", re.IGNORECASE)
_NUMBERS = re.compile(r"\d+")


class ClientTooOld(DomainError):
    code = "client_too_old"
    http_status = 426


def minimum_agent_version() -> str:
    configured = getattr(settings, "SAFESTOP_MIN_AGENT_VERSION", None)
    return str(
        configured or os.environ.get("SAFESTOP_MIN_AGENT_VERSION") or DEFAULT_MIN_AGENT_VERSION
    )


def client_version(meta: Any) -> str | None:
    """The agent version a request names, or None (not a safestop-agent client)."""
    explicit = str(meta.get("HTTP_SAFESTOP_AGENT_VERSION", "")).strip()
    if explicit:
        return explicit
    match = _USER_AGENT.search(str(meta.get("HTTP_USER_AGENT", "")))
    return match.group(1) if match else None


def version_key(version: str) -> tuple[int, ...]:
    """`0.2.0` → (0, 2, 0); a suffix (`0.3.0rc1`, `0.2.0.dev3`) is ignored, missing parts are 0."""
    numbers = [int(part) for part in _NUMBERS.findall(version.split("+")[0])[:3]]
    return tuple(numbers + [0] * (3 - len(numbers)))


def check_agent_version(meta: Any) -> None:
    """Raise `ClientTooOld` when the request names an agent version below the minimum."""
    version = client_version(meta)
    if version is None:
        return
    minimum = minimum_agent_version()
    if version_key(version) < version_key(minimum):
        raise ClientTooOld(
            f"safestop-agent {version} is too old for this server, which needs {minimum} or "
            f"newer: upgrade it (pip install -U 'safestop-agent>={minimum}')",
            client_version=version,
            minimum_version=minimum,
        )
