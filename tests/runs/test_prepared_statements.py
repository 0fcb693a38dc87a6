"""The transitions' hand-built statements (`runs.sql`) are prepared on their connection: a permit
and a result, asked again, send no statement PostgreSQL has to parse and plan again. Parsing and
planning were most of PostgreSQL's own CPU in each (docs/BENCHMARKS.md). Counted from
PostgreSQL's own view of the session (`pg_prepared_statements`), never timed.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.settings import postgres_database
from runs.services._run_lock import run_lock_statement
from tests.support.policies import permit, result
from tests.support.round_trips import RoundTrips
from tests.support.scenarios import make_running

# Real transactions, as the gateway's and the API's permits run.
pytestmark = pytest.mark.django_db(transaction=True)


def _prepared() -> dict[str, int]:
    """This session's prepared statements: name → how many times each was executed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements "
            "WHERE NOT from_sql"
        )
        return dict(cursor.fetchall())


def test_a_permit_and_a_result_asked_again_are_neither_parsed_nor_planned_again(team, monkeypatch):
    run, _ = make_running(team)
    permit(run, "warm")
    result(run, "warm", "succeeded")
    before = _prepared()
    assert before, "the first permit and result prepared their statements"

    with RoundTrips().counting(monkeypatch) as trips:
        permit(run, "c1")
        result(run, "c1", "succeeded")
    after = _prepared()

    # Nothing new was prepared: every statement was one the warm call had prepared.
    assert set(after) == set(before)
    # And every one the two pipelined ran as a prepared statement (each execution counts).
    assert trips.alone == []
    # (but the COMMIT that goes with the writes, which is not prepared)
    sent = [statement for statement in trips.in_pipelines if statement != "COMMIT"]
    assert sum(after.values()) - sum(before.values()) == len(sent) > 0


def test_the_query_log_shows_a_prepared_statements_text(team):
    run, _ = make_running(team)
    permit(run, "warm")
    with CaptureQueriesContext(connection) as queries:
        permit(run, "c1")
    logged = [query["sql"] for query in queries.captured_queries]
    assert None not in logged
    # As PostgreSQL received it: its parameters are placeholders, bound apart.
    assert run_lock_statement().replace("%s", "$1") in logged


def test_preparing_can_be_turned_off_for_a_pooler_that_cannot_keep_them(monkeypatch):
    url = "postgres://postgres@127.0.0.1:5432/safestop"
    monkeypatch.delenv("SAFESTOP_DB_PREPARED_STATEMENTS", raising=False)
    assert postgres_database(url)["OPTIONS"]["prepare_threshold"] == 0
    monkeypatch.setenv("SAFESTOP_DB_PREPARED_STATEMENTS", "0")
    assert "prepare_threshold" not in postgres_database(url)["OPTIONS"]
