"""Child processes (dispatchers, a Celery worker) on this session's test database."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def database_url_for_children() -> str:
    """DATABASE_URL for a child process: the database pytest-django created for this session."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("REDIS_URL",)}
    env.update(
        {
            "DATABASE_URL": database_url_for_children(),
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "SAFESTOP_LOG_LEVEL": "WARNING",
        }
    )
    env.update(extra)
    return env
