"""The ledger refuses UPDATE and DELETE on PostgreSQL and SQLite; verify_ledger finds tampering."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import DatabaseError, transaction

from runs import services
from runs.actors import Actor
from runs.ledger import ledger_verify
from runs.models import LedgerEntry, StopReason
from tests.support.ledger import behind_the_triggers
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def _stopped_run(team):
    run, lease = make_running(team)
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=Actor("user", "1", "alice"))
    return run


def test_every_entry_chains_to_the_previous_one(team):
    run = _stopped_run(team)
    entries = list(LedgerEntry.objects.filter(run=run).order_by("run_seq"))
    assert [e.run_seq for e in entries] == list(range(1, len(entries) + 1))
    for previous, entry in zip(entries, entries[1:], strict=False):
        assert entry.prev_hash == previous.hash
    assert ledger_verify(run_id=run.pk) == (len(entries), None)


def test_postgres_refuses_update_and_delete_of_a_ledger_entry(team):
    run = _stopped_run(team)
    entry = LedgerEntry.objects.filter(run=run).first()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        LedgerEntry.objects.filter(pk=entry.pk).update(reason="forged")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        LedgerEntry.objects.filter(pk=entry.pk).delete()
    entry.refresh_from_db()
    assert entry.reason != "forged"


def test_verify_ledger_names_the_first_row_changed_behind_the_triggers_back(team, capsys):
    run = _stopped_run(team)
    call_command("verify_ledger")
    assert "ledger OK" in capsys.readouterr().out
    target = LedgerEntry.objects.filter(run=run, action="run.stop_requested").get()
    behind_the_triggers(
        "UPDATE runs_ledgerentry SET reason = 'budget_exhausted' WHERE id = %s", [target.pk]
    )
    with pytest.raises(SystemExit) as exited:
        call_command("verify_ledger")
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert f"entry {target.pk}" in err and "changed" in err


def test_verify_ledger_notices_a_removed_entry(team):
    run = _stopped_run(team)
    victim = LedgerEntry.objects.filter(run=run, run_seq=2).get()
    behind_the_triggers("DELETE FROM runs_ledgerentry WHERE id = %s", [victim.pk])
    _checked, broken = ledger_verify(run_id=run.pk)
    assert broken is not None and "gap" in broken.problem and broken.run_seq == 3


SQLITE_SCRIPT = """
import django, os
django.setup()
from django.db import DatabaseError, connection
from runs import services
from runs.actors import Actor
from runs.models import LedgerEntry
from runs.tokens import team_ensure
team = team_ensure(slug="lite")
run = services.run_create(team=team, title="t", agent="a", actor=Actor.system("t"))
entry = LedgerEntry.objects.get(run=run)
for attempt in ("update", "delete"):
    try:
        if attempt == "update":
            LedgerEntry.objects.filter(pk=entry.pk).update(reason="forged")
        else:
            LedgerEntry.objects.filter(pk=entry.pk).delete()
        print(attempt, "ALLOWED")
    except DatabaseError as error:
        print(attempt, "REFUSED", error)
print("journal", connection.cursor().execute("PRAGMA journal_mode").fetchone()[0])
"""


@pytest.mark.slow  # a SQLite database migrated in a subprocess
def test_sqlite_refuses_update_and_delete_of_a_ledger_entry(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(
        SAFESTOP_SQLITE_PATH=str(tmp_path / "ledger.sqlite3"),
        DJANGO_SETTINGS_MODULE="console.settings",
    )
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    result = subprocess.run(
        [sys.executable, "-c", SQLITE_SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("update REFUSED") and "append-only" in lines[0]
    assert lines[1].startswith("delete REFUSED") and "append-only" in lines[1]
    assert lines[2] == "journal wal"
