"""Counting what a caller waits for on PostgreSQL: statements sent alone, pipelines, commits,
and the round trips on the wire themselves."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection
from psycopg import pq
from psycopg.pq import TransactionStatus


class RoundTrips:
    """The statements sent, and how: inside a psycopg pipeline (one round trip per pipeline)
    or alone (one each); and the commits. `waits`: the round trips that really happened, read
    from libpq's protocol trace: each time the client, having sent messages, reads the
    server's (a BEGIN that psycopg syncs on its own, a fetch inside a pipeline, show here)."""

    def __init__(self) -> None:
        self.pipelines = 0
        self.commits = 0
        self.in_pipelines: list[str] = []
        self.alone: list[str] = []
        self.waits = 0
        self.messages: list[str] = []
        self._depth = 0

    @property
    def count(self) -> int:
        return self.pipelines + len(self.alone) + self.commits

    def statement(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        (self.in_pipelines if self._depth else self.alone).append(sql)
        return execute(sql, params, many, context)

    @contextmanager
    def counting(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[RoundTrips]:
        connection.ensure_connection()
        raw = connection.connection
        pipeline = raw.pipeline

        @contextmanager
        def counted_pipeline() -> Iterator[Any]:
            self.pipelines += 1
            self._depth += 1
            try:
                with pipeline() as opened:
                    yield opened
            finally:
                self._depth -= 1

        commit = raw.commit

        def counted_commit() -> None:
            # psycopg sends nothing when the transaction's COMMIT already went with its last
            # pipeline (`runs.sql.pipelined(commit=True)`): the connection is idle.
            if raw.pgconn.transaction_status != TransactionStatus.IDLE:
                self.commits += 1
            commit()

        monkeypatch.setattr(raw, "pipeline", counted_pipeline)
        monkeypatch.setattr(raw, "commit", counted_commit)
        with tempfile.TemporaryFile() as trace:
            raw.pgconn.trace(trace.fileno())
            raw.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                with connection.execute_wrapper(self.statement):
                    yield self
            finally:
                raw.pgconn.untrace()
                monkeypatch.undo()
                trace.seek(0)
                self._read_trace(trace.read().decode(errors="replace"))

    def _read_trace(self, text: str) -> None:
        # Lines are "F|B <length> <message> ...": a wait is a run of the client's messages
        # followed by the server's.
        sender = ""
        for line in text.splitlines():
            fields = line.split("\t")
            if len(fields) < 3 or fields[0] not in ("F", "B"):
                continue
            self.messages.append(f"{fields[0]} {fields[2]}")
            if fields[0] == "B" and sender == "F":
                self.waits += 1
            sender = fields[0]
