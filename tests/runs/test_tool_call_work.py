"""What a permit and a result compute in Python besides their round trips, counted, never timed:
each is on the path of every tool call through the MCP gateway (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import pytest
from psycopg import _column

from runs.models import ExecutionRecord
from tests.support.policies import permit, result
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_permit_and_a_result_describe_no_column(team, monkeypatch):
    # Reading a statement's rows needs no column descriptions; psycopg builds one object per
    # column (the run lock answers about sixty) whenever `cursor.description` is asked.
    run, _ = make_running(team)
    permit(run, "warm")
    result(run, "warm", "succeeded")
    described = []
    build = _column.Column.__init__

    def counted(self, *args, **kwargs):
        described.append(1)
        build(self, *args, **kwargs)

    monkeypatch.setattr(_column.Column, "__init__", counted)
    permit(run, "c1")
    result(run, "c1", "failed")
    monkeypatch.undo()
    assert described == []
    assert ExecutionRecord.objects.get(run=run, tool_call_id="c1").execution_state == "failed"
