"""A transaction's BEGIN goes with its first pipeline and its COMMIT with its last one.

psycopg synced on a BEGIN in pipeline mode (a round trip of its own before every transition's
first statement), and a transition's last writes were followed by a COMMIT in a round trip of
its own (console/postgresql/base.py, `runs.sql.pipelined(commit=True)`). Counted on the wire
with libpq's protocol trace (`RoundTrips.waits`), never timed. What must still hold: a failed
write commits nothing, a statement after the COMMIT is refused, the on-commit hooks run, and
a ledger listener that writes keeps its transaction open.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from console.postgresql.base import Connection
from runs import hooks, sql
from runs.models import ExecutionRecord, LedgerEntry, Team
from tests.support.policies import permit
from tests.support.round_trips import RoundTrips
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db(transaction=True)

_SLUG = 'SELECT "slug" FROM "runs_team" WHERE "id" = %s'
_RENAME = 'UPDATE "runs_team" SET "name" = %s WHERE "id" = %s'


def test_connections_are_the_subclass_that_sends_begin_with_the_pipeline():
    connection.ensure_connection()
    assert isinstance(connection.connection, Connection)


def test_a_transactions_first_pipeline_is_one_round_trip_with_its_begin(team, monkeypatch):
    with RoundTrips().counting(monkeypatch) as trips:
        with transaction.atomic(durable=True):
            (rows,) = sql.pipelined((_SLUG, [team.pk]))
    assert rows == [(team.slug,)]
    # The pipeline (BEGIN and the statement), then the COMMIT: one BEGIN sent, not synced.
    assert trips.waits == 2
    assert trips.messages.count("B CommandComplete") == 3  # BEGIN, the SELECT, COMMIT
    assert trips.messages.count("F Sync") == 1


def test_the_commit_goes_with_the_last_pipeline(team, monkeypatch):
    committed: list[bool] = []
    with RoundTrips().counting(monkeypatch) as trips:
        with transaction.atomic(durable=True):
            sql.pipelined((_SLUG, [team.pk]))
            transaction.on_commit(lambda: committed.append(True))
            sql.pipelined((_RENAME, ["Renamed", team.pk]), commit=True)
    assert trips.waits == 2
    assert trips.commits == 0
    assert trips.in_pipelines[-1] == "COMMIT"
    assert committed == [True]  # `atomic`'s on-commit hooks still ran
    assert Team.objects.get(pk=team.pk).name == "Renamed"
    assert connection.execute_wrappers == []  # the guard left with its block


def test_a_failed_write_commits_nothing(team):
    other = Team.objects.create(slug="other", name="Other")
    with pytest.raises(IntegrityError), transaction.atomic(durable=True):
        sql.pipelined(
            (_RENAME, ["First", team.pk]),
            ('UPDATE "runs_team" SET "slug" = %s WHERE "id" = %s', [other.slug, team.pk]),
            commit=True,
        )
    assert Team.objects.get(pk=team.pk).name != "First"
    # The connection is usable again, in a transaction of its own.
    with transaction.atomic(durable=True):
        sql.pipelined((_RENAME, ["Second", team.pk]), commit=True)
    assert Team.objects.get(pk=team.pk).name == "Second"


def test_a_statement_after_the_commit_is_refused(team):
    with pytest.raises(sql.StatementAfterCommit), transaction.atomic(durable=True):
        sql.pipelined((_RENAME, ["Committed", team.pk]), commit=True)
        Team.objects.filter(pk=team.pk).update(name="Alone")
    assert Team.objects.get(pk=team.pk).name == "Committed"
    # The refusal ended with its block: the next transaction on the connection runs.
    with transaction.atomic(durable=True):
        Team.objects.filter(pk=team.pk).update(name="Next")
    assert Team.objects.get(pk=team.pk).name == "Next"
    assert connection.execute_wrappers == []


@pytest.mark.parametrize("block", ["savepoint", "not durable"])
def test_only_the_outermost_durable_block_commits_with_its_pipeline(team, block, monkeypatch):
    with RoundTrips().counting(monkeypatch) as trips:
        with transaction.atomic(durable=block == "savepoint"):
            if block == "savepoint":
                with transaction.atomic():
                    sql.pipelined((_RENAME, ["Inner", team.pk]), commit=True)
            else:
                sql.pipelined((_RENAME, ["Inner", team.pk]), commit=True)
    assert "COMMIT" not in trips.in_pipelines
    assert trips.commits == 1
    assert Team.objects.get(pk=team.pk).name == "Inner"


def test_a_permit_whose_entry_a_listener_writes_for_keeps_its_transaction_open(team, monkeypatch):
    """A listener's rows commit with the entry they are about (a transactional outbox): the
    permit's COMMIT waits for them."""
    run, _ = make_running(team)
    seen: list[int] = []

    def listener(entry: LedgerEntry, locked: Any) -> None:
        if entry.action == "tool.permitted":
            Team.objects.filter(pk=team.pk).update(name=f"Listened {entry.run_seq}")
            seen.append(entry.run_seq)

    monkeypatch.setattr(hooks, "_entry_listeners", [*hooks._entry_listeners, listener])
    monkeypatch.setattr(
        hooks,
        "_listened_actions",
        {**hooks._listened_actions, listener: frozenset({"tool.permitted"})},
    )
    assert hooks.entry_listened("tool.permitted")
    with RoundTrips().counting(monkeypatch) as trips:
        permit(run, "c1")
    assert "COMMIT" not in trips.in_pipelines
    assert trips.commits == 1
    assert Team.objects.get(pk=team.pk).name == f"Listened {seen[0]}"
    assert ExecutionRecord.objects.filter(run=run, tool_call_id="c1").exists()


def test_the_notifications_listener_says_which_entries_it_writes_for():
    assert hooks.entry_listened("run.stopped_dirty")
    assert hooks.entry_listened("approval.requested")
    assert not hooks.entry_listened("tool.permitted")
    assert not hooks.entry_listened("tool.result")
