"""Dropped database connections (a failover or a restarted PostgreSQL): the pool replaces a connection the server
killed before handing it out, and a database that truly cannot be reached is a 503 with
`Retry-After` — JSON under /api/ — never an HTML 500."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection
from django.test import Client
from psycopg_pool import ConnectionPool

from tests.support.api import url
from tests.support.scenarios import running

# Real commits: the backends killed below must be the ones the pool holds between requests.
pytestmark = pytest.mark.django_db(transaction=True)


def _admin() -> psycopg.Connection[Any]:
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    return psycopg.connect(**params, autocommit=True)


def _terminate_every_other_backend() -> int:
    """`pg_terminate_backend` on every connection to the test database but this one: what a
    PostgreSQL restart or a failover does to the pool. Each call returns once its backend has
    exited (the timeout argument), so the pool holds connections the server has dropped."""
    with _admin() as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@pytest.fixture
def queries_sent(monkeypatch):
    """The statements psycopg sends outside Django's cursors (a pool's check is one), and the
    outcome of each psycopg_pool `check_connection` (the check that is a round trip)."""
    sent: dict[str, list[str]] = {"queries": [], "full checks": []}
    execute = psycopg.Connection.execute
    check = ConnectionPool.check_connection

    def counted(self, query, *args, **kwargs):
        sent["queries"].append(str(query))
        return execute(self, query, *args, **kwargs)

    def counted_check(conn):
        try:
            check(conn)
        except psycopg.Error:
            sent["full checks"].append("failed")
            raise
        sent["full checks"].append("passed")

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted_check))
    return sent


@pytest.fixture
def one_connection_pool():
    """A pool of its own, holding one connection (min_size) while nothing else asks: filled
    before the first request, which would otherwise find it empty and make it grow a second."""
    connection.close()
    connection.close_pool()
    connection.pool.open(wait=True)


def test_a_pooled_connection_is_handed_out_without_a_query(one_connection_pool, queries_sent):
    pid = _backend_pid()
    connection.close()  # back to the pool, idle

    assert _backend_pid() == pid  # the same connection, from the pool
    # its socket was quiet: no round trip to check it
    assert queries_sent == {"queries": [], "full checks": []}


def test_a_connection_the_server_dropped_is_replaced_before_use(one_connection_pool, queries_sent):
    pid = _backend_pid()
    connection.close()
    # Every connection the pool holds, not only the one it handed out: a pool still filling
    # while its first request waits may hold two, and the other would come out live, unchecked.
    assert _terminate_every_other_backend() >= 1

    assert _backend_pid() != pid
    # its socket said something: psycopg_pool's check ran, and the pool replaced it
    assert queries_sent["full checks"] and set(queries_sent["full checks"]) == {"failed"}


def _unreachable(*args, **kwargs):
    raise OperationalError('connection to server at "db" failed: Connection refused')


def test_an_unreachable_database_is_a_json_503_with_retry_after(team, agent_token, monkeypatch):
    run, _lease = running(team)
    connection.close()
    monkeypatch.setattr(connection, "ensure_connection", _unreachable)
    response = Client().get(url(run), **agent_token.header)
    monkeypatch.undo()
    assert response.status_code == 503
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"] == "database_unavailable"
    assert int(response["Retry-After"]) > 0


def test_an_unreachable_database_is_a_503_on_the_console_too(team, bob, monkeypatch):
    run, _lease = running(team)
    console = Client()
    console.force_login(bob)
    connection.close()
    monkeypatch.setattr(connection, "ensure_connection", _unreachable)
    response = console.get(f"/runs/{run.pk}/")
    monkeypatch.undo()
    assert response.status_code == 503 and int(response["Retry-After"]) > 0
    assert b"database" in response.content and b"Traceback" not in response.content
