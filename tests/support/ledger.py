"""The ledger in tests: editing it the way only a superuser could, behind the append-only
triggers' back; a fresh anchor directory per test; and a flush that may empty the ledger.

The verification tests need a changed or missing entry; `session_replication_role = replica`
switches user triggers off for this session only, and is switched back at once.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
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


def rechain(
    run_id: str | None,
    digest: Callable[[dict[str, Any]], str],
    *,
    hash_version: int,
    key_id: str = "",
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Rewrite a run's whole chain behind the triggers, as someone who can write the database
    but holds no ledger key would: `edit` changes an entry's columns, `digest` makes each hash
    from an entry's columns (with its new prev_hash), every link is made to agree again."""
    from runs.ledger import GENESIS_HASH, _timestamp
    from runs.models import LedgerEntry

    prev = GENESIS_HASH
    for entry in LedgerEntry.objects.filter(run_id=run_id).order_by("run_seq"):
        columns = {
            "run_id": entry.run_id,
            "run_seq": entry.run_seq,
            "at": _timestamp(entry.at),
            "actor_kind": entry.actor_kind,
            "actor_id": entry.actor_id,
            "actor": entry.actor,
            "team_slug": entry.team_slug,
            "action": entry.action,
            "reason": entry.reason,
            "payload": entry.payload,
            "prev_hash": prev,
        }
        if edit is not None:
            edit(columns)
        new_hash = digest(columns)
        behind_the_triggers(
            "UPDATE runs_ledgerentry SET team_slug = %s, reason = %s, payload = %s, "
            "prev_hash = %s, hash = %s, hash_version = %s, key_id = %s WHERE id = %s",
            [
                columns["team_slug"],
                columns["reason"],
                json.dumps(columns["payload"]),
                prev,
                new_hash,
                hash_version,
                key_id,
                entry.pk,
            ],
        )
        prev = new_hash


def legacy_digest(columns: dict[str, Any]) -> str:
    """The plain hash entries had before the chain was keyed (no key, no team)."""
    from runs.ledger import legacy_entry_hash

    return legacy_entry_hash(**{k: v for k, v in columns.items() if k != "team_slug"})


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
