"""Counting what a caller waits for on PostgreSQL: statements sent alone, pipelines, commits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection


class RoundTrips:
    """The statements sent, and how: inside a psycopg pipeline (one round trip per pipeline)
    or alone (one each); and the commits."""

    def __init__(self) -> None:
        self.pipelines = 0
        self.commits = 0
        self.in_pipelines: list[str] = []
        self.alone: list[str] = []
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
            self.commits += 1
            commit()

        monkeypatch.setattr(raw, "pipeline", counted_pipeline)
        monkeypatch.setattr(raw, "commit", counted_commit)
        with connection.execute_wrapper(self.statement):
            yield self
        monkeypatch.undo()
