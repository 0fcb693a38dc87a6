"""Editing the ledger the way only a superuser could: behind the append-only triggers' back.

The verification tests need a changed or missing entry; `session_replication_role = replica`
switches user triggers off for this session only, and is switched back at once.
"""

from __future__ import annotations

from typing import Any

from django.db import connection


def behind_the_triggers(sql: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
