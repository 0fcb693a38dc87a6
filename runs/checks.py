"""System checks for settings a deployment gets wrong quietly (`manage.py check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.core.exceptions import ImproperlyConfigured


@register(deploy=True)
def ledger_key_check(app_configs: Any = None, **kwargs: Any) -> list[Warning | Error]:
    """The ledger's HMAC key must be private: with the published development key, anyone who can
    write the database can recompute every hash (docs/OPERATIONS.md, the ledger's subsection)."""
    from runs.ledger_keys import ledger_keys

    try:
        ledger_keys()
    except ImproperlyConfigured as problem:
        return [Error(str(problem), id="safestop.E001")]
    if settings.SAFESTOP_LEDGER_KEY == settings.DEV_LEDGER_KEY:
        return [
            Warning(
                "SAFESTOP_LEDGER_KEY is the public development key: the ledger's hashes can be "
                "recomputed by anyone who can write the database.",
                hint="Set SAFESTOP_LEDGER_KEY (or SAFESTOP_LEDGER_KEY_FILE) to id:secret, "
                "with a secret from python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
                id="safestop.W001",
            )
        ]
    if not settings.SAFESTOP_LEDGER_ANCHOR_DIR:
        return [
            Warning(
                "SAFESTOP_LEDGER_ANCHOR_DIR is empty: no chain head is anchored outside the "
                "database, so entries removed from the end of a chain are not found.",
                id="safestop.W002",
            )
        ]
    return []
