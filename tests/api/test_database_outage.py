"""Dropped database connections (a failover or a restarted PostgreSQL): the pool replaces a connection the server
killed before handing it out, and a database that truly cannot be reached is a 503 with
`Retry-After` — JSON under /api/ — never an HTML 500."""

from __future__ import annotations

import psycopg
import pytest
from django.db import OperationalError, connection
from django.test import Client

from tests.support.api import url
from tests.support.scenarios import running

# Real commits: the backends killed below must be the ones the pool holds between requests.
pytestmark = pytest.mark.django_db(transaction=True)


def _terminate_every_other_backend() -> int:
    """`pg_terminate_backend` on every connection to the test database but this one: what a
    PostgreSQL restart or a failover does to the pool."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_requests_after_pg_terminate_backend_succeed(team, agent_token, bob):
    run, _lease = running(team)
    # A pool of its own: threads of earlier tests may still hold (leak) connections of the
    # shared one, and a pool at max_size with every idle connection killed waits, not checks.
    connection.close()
    connection.close_pool()
    api, console = Client(), Client()
    console.force_login(bob)
    assert api.get(url(run), **agent_token.header).status_code == 200
    assert console.get(f"/runs/{run.pk}/").status_code == 200
    connection.close()  # the test's own connection goes back to the pool too

    assert _terminate_every_other_backend() >= 1

    response = api.get(url(run), **agent_token.header)
    assert response.status_code == 200, response.content[:300]
    assert response.json()["id"] == run.pk
    assert console.get(f"/runs/{run.pk}/").status_code == 200


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
