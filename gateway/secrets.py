"""Upstream secrets (a stdio command's env, an HTTP upstream's headers) encrypted at rest.

Fernet (AES-128-CBC + HMAC-SHA256) keyed from `SAFESTOP_MCP_SECRET_KEY`, or from SECRET_KEY
when that is unset: a database dump alone never shows a token an upstream was registered with.
Changing the key makes the stored secrets unreadable (the upstream must be registered again).
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


def _fernet() -> Fernet:
    material = getattr(settings, "SAFESTOP_MCP_SECRET_KEY", "") or settings.SECRET_KEY
    digest = hashlib.sha256(b"safestop.mcp.upstream-secrets:" + material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(values: dict[str, str]) -> str:
    if not values:
        return ""
    return _fernet().encrypt(json.dumps(values, sort_keys=True).encode()).decode()


class SecretUnreadable(Exception):
    """The stored secret was sealed with another key."""


def unseal(sealed: str) -> dict[str, Any]:
    if not sealed:
        return {}
    try:
        return dict(json.loads(_fernet().decrypt(sealed.encode())))
    except InvalidToken as error:
        raise SecretUnreadable("the upstream's secrets were sealed with another key") from error
