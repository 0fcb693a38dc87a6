"""The ledger in tests: editing it the way only a superuser could, behind the append-only
triggers' back; a fresh anchor directory per test; and a flush that may empty the ledger.

The verification tests need a changed or missing entry; `session_replication_role = replica`
switches user triggers off for this session only, and is switched back at once.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection


def behind_the_triggers(sql: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")


def pytest_configure(config: pytest.Config) -> None:
    """A transactional test ends with a flush, which TRUNCATEs every table: the ledger's trigger
    refuses that (as it should anywhere else), so the suite's flush switches user triggers off
    for its own transaction. Processes the suite starts (`manage.py serve`, workers) anchor into
    a directory of this session, never into the working tree's."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    real = DatabaseOperations.sql_flush

    def sql_flush(self: Any, style: Any, tables: Any, **kwargs: Any) -> list[str]:
        statements = real(self, style, tables, **kwargs)
        if statements and "runs_ledgerentry" in tables:
            return ["SET LOCAL session_replication_role = replica", *statements]
        return statements

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
    os.environ.setdefault(
        "SAFESTOP_LEDGER_ANCHOR_DIR", tempfile.mkdtemp(prefix="safestop-test-anchors-")
    )


@pytest.fixture(autouse=True)
def ledger_anchor_dir(settings: Any, tmp_path: Path) -> Iterator[Path]:
    """Each test's own anchor directory: an anchor names chains of this test's database only
    (the next test's database has none of them)."""
    directory = tmp_path / "ledger-anchors"
    settings.SAFESTOP_LEDGER_ANCHOR_DIR = str(directory)
    yield directory
