"""Django's PostgreSQL backend: a pooled connection is checked before use without a round trip,
and a transaction's BEGIN goes with the statements of its first pipeline.

A connection the server dropped (a restart, a failover, `pg_terminate_backend`) stays in the pool
looking idle; checked on the way out, it is replaced, so the request gets a live one instead of
an error. Django's own check (CONN_HEALTH_CHECKS with a pool) is psycopg_pool's
`check_connection`: an empty query and its answer, one round trip before every request's first
statement — a single event's fourth, beside its two pipelines and its COMMIT
(docs/BENCHMARKS.md). A dropped connection says so on its socket instead: the server writes its
FATAL and closes, so the socket polls readable, where an idle connection has nothing to read.
The query still runs, and decides, when the socket is not quiet (the server's goodbye, an
asynchronous notice, a TLS record).

psycopg starts a transaction in pipeline mode with a round trip of its own: it queues BEGIN, then
syncs and waits for the answer before the pipeline's first statement is even sent (so that the
next statement does not queue a second BEGIN while the first is still in its queue). Every
transition opens its transaction with a pipeline (the run lock and its reads), so each one paid
a round trip more than it sent pipelines for, with nothing to wait for. `Connection` sends the
BEGIN without waiting: once sent, the connection is busy, not idle, and no second one is queued;
its answer comes back with the pipeline's others (`tests/runs/test_wire_round_trips.py`). The
method overridden is private to psycopg: pyproject.toml keeps psycopg below the next minor
version until that test has passed on it.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

# Anything but silence on an idle connection's socket: data, end of stream, an error, a hang-up.
_NOT_QUIET = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL
# Connections tried before giving up: more dead ones in a row than this means the server is
# refusing, and the request's answer is the outage's 503 (`console.middleware.ErrorAnswers`).
_ATTEMPTS = 3


class Connection(psycopg.Connection):  # type: ignore[type-arg]
    """psycopg's connection; in a pipeline, a transaction's BEGIN is sent with the statements
    after it instead of in a round trip of its own (the module's docstring)."""

    def _start_query(self) -> Any:
        if (
            self._pipeline is None
            or self._autocommit
            or self.pgconn.transaction_status != TransactionStatus.IDLE
        ):
            return (yield from super()._start_query())
        # As a statement is sent in a pipeline (`Cursor._execute_gen`): queued, then written
        # out without waiting for its answer, which the pipeline's sync collects.
        yield from self._exec_command(self._get_tx_start_command())
        yield from self._pipeline._communicate_gen()


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = self._new_connection(conn_params)
        if self.pool is None:
            return connection
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                connection_check(connection)
                return connection
            except psycopg.Error:
                # Closed, the pool drops it and opens a new one in its place.
                connection.close()
                self.pool.putconn(connection)
                if attempt == _ATTEMPTS:
                    raise
            connection = self._new_connection(conn_params)
        raise AssertionError("unreachable")

    def _new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        if type(connection) is psycopg.Connection:
            # Made by Django (`psycopg.connect`) or taken from the pool: the same object, given
            # the subclass's one method (the subclass adds no state).
            connection.__class__ = Connection
        return connection


def connection_check(connection: Any) -> None:
    """Raise `psycopg.Error` for a connection the server dropped."""
    if connection.closed or connection.broken:
        raise psycopg.OperationalError("the connection is closed")
    if not socket_quiet(connection):
        ConnectionPool.check_connection(connection)


def socket_quiet(connection: Any) -> bool:
    """Nothing to read, no hang-up: what an idle connection's socket says. A poll, not I/O."""
    try:
        poller = select.poll()
        poller.register(connection.fileno(), _NOT_QUIET)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False  # no socket to ask: the query decides
