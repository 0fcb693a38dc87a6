"""What one `tools/call` costs the database through the gateway: the permit's statements and the
result's, nothing of the gateway's own, one transaction each; and a call's result committed
before the session's next permit (DESIGN §15's overhead, docs/BENCHMARKS.md).

The gateway's ASGI app runs in this process (no daphne), so every statement on every thread is
counted; the upstream is server-everything over stdio, as in the bench.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from gateway import asgi, lane
from gateway.sessions import REGISTRY
from runs import services
from runs.models import ExecutionRecord

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Tally:
    """Statements and commits on every thread, and which service each ran in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counting = False
        self.statements: list[str] = []
        self.commits = 0
        self.inside: dict[int, str] = {}  # thread id → the service running on it
        self.by_service: dict[str, int] = {}
        self.spans: list[tuple[str, float, float]] = []  # (service, started, ended)

    def statement(self, sql: str) -> None:
        with self.lock:
            if self.counting:
                self.statements.append(sql)
                where = self.inside.get(threading.get_ident(), "the gateway")
                self.by_service[where] = self.by_service.get(where, 0) + 1

    def service(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.inside[threading.get_ident()] = name
            started = time.monotonic()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inside.pop(threading.get_ident(), None)
                with self.lock:
                    self.spans.append((name, started, time.monotonic()))

        return call


@pytest.fixture
def tally(monkeypatch: pytest.MonkeyPatch) -> Tally:
    counted = Tally()
    execute, executemany = CursorWrapper._execute, CursorWrapper._executemany
    commit = BaseDatabaseWrapper.commit

    def _execute(self: CursorWrapper, sql: str, *args: Any, **kwargs: Any) -> Any:
        counted.statement(sql)
        return execute(self, sql, *args, **kwargs)

    def _executemany(self: CursorWrapper, sql: str, *args: Any, **kwargs: Any) -> Any:
        counted.statement(sql)
        return executemany(self, sql, *args, **kwargs)

    def _commit(self: BaseDatabaseWrapper) -> None:
        with counted.lock:
            counted.commits += counted.counting
        commit(self)

    monkeypatch.setattr(CursorWrapper, "_execute", _execute)
    monkeypatch.setattr(CursorWrapper, "_executemany", _executemany)
    monkeypatch.setattr(BaseDatabaseWrapper, "commit", _commit)
    for name in ("permit_request", "tool_result_report"):
        monkeypatch.setattr(services, name, counted.service(name, getattr(services, name)))
    return counted


@pytest.fixture
def db_threads(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The gateway's database threads for this test only: their connections are closed after."""
    threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-gateway-db")
    monkeypatch.setattr(lane, "_DB_THREADS", threads)
    yield threads
    both = threading.Barrier(2)  # one close on each thread

    def close() -> None:
        both.wait(timeout=10)
        connection.close()

    for done in [threads.submit(close) for _ in range(2)]:
        done.result()
    threads.shutdown(wait=True)


async def _post(token: str, message: dict[str, Any], session_id: str = "") -> list[dict[str, Any]]:
    """One POST to `/mcp/everything/` through the gateway's ASGI app; the messages it sent."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    if session_id:
        headers.append((b"mcp-session-id", session_id.encode()))
    scope = {
        "type": "http",
        "path": "/mcp/everything/",
        "method": "POST",
        "headers": headers,
        "client": ("127.0.0.1", 1),
    }
    body = json.dumps(message).encode()
    sent: list[dict[str, Any]] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asgi.handle(scope, receive, send)
    return sent


def _echo(rpc_id: int, text: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rpc_id,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"message": text}},
    }


def test_a_tools_call_costs_its_permit_and_its_result_only(
    everything, agent_token, tally: Tally, db_threads: Any
) -> None:
    async def scenario() -> tuple[list[bytes], str]:
        opened = await _post(
            agent_token.raw,
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "counting", "version": "1"},
                },
            },
        )
        session_id = dict(opened[0]["headers"])[b"mcp-session-id"].decode()
        session = REGISTRY[session_id]
        await _post(
            agent_token.raw, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session_id
        )
        await _post(agent_token.raw, _echo(2, "warm"), session_id)
        await session._reports_done()
        tally.spans.clear()
        tally.counting = True
        answers = []
        for rpc_id in (3, 4, 5):  # back to back, as an agent's loop sends them
            sent = await _post(agent_token.raw, _echo(rpc_id, f"m{rpc_id}"), session_id)
            answers.append(b"".join(m.get("body", b"") for m in sent))
        await session._reports_done()
        tally.counting = False
        run_id = session.run_id
        await session.end(reason="client_closed")
        return answers, run_id

    answers, run_id = asyncio.run(scenario())
    assert all(f"Echo: m{n}".encode() in answers[n - 3] for n in (3, 4, 5))
    states = ExecutionRecord.objects.filter(run_id=run_id).values_list("tool", "execution_state")
    assert sorted(states) == [("echo", "succeeded")] * 4

    # Every statement of the three calls ran inside their permits and results: the gateway
    # itself asks nothing of the database per call (its token, its tools, its run are known).
    assert tally.by_service.get("the gateway", 0) == 0, tally.statements
    assert set(tally.by_service) == {"permit_request", "tool_result_report"}
    # One transaction each, whose COMMIT went with its writes (no round trip of its own).
    assert tally.commits == 6
    assert tally.statements.count("COMMIT") == 6
    # A call's result is committed before the session's next permit starts: policies that
    # count a run's failures in a row see every one of them.
    order = sorted(tally.spans, key=lambda span: span[1])
    assert [name for name, _, _ in order] == ["permit_request", "tool_result_report"] * 3
    for (_, _, result_ended), (_, next_started, _) in zip(order[1::2], order[2::2], strict=False):
        assert result_ended <= next_started
    # Each of the two is four statements of its own, built once (`_permit_sql`, `_result_sql`):
    # the run lock; one read (the permit: lease, retry, step, rules, whether the team has a
    # budget, ledger head; the result: the record, ledger head); one write (the record with the
    # run's counters); the ledger entry. The policies' own statements (`policies_*`) are theirs
    # to count (tests/policies/test_cost_of_checking.py).
    ours = [sql for sql in tally.statements if '"policies_' not in sql and sql != "COMMIT"]
    assert len(ours) == 3 * (4 + 4), ours
    assert sum(sql.lstrip().startswith("SELECT") for sql in ours) == 3 * (2 + 2), ours
    # A team without a budget has no spend to read: no statement names its budget row alone.
    assert not any(sql.lstrip().startswith('SELECT "runs_teambudget"') for sql in ours), ours
    # A team that never had a policy keeps no facts: its checks read the policy set's version
    # (one statement in each permit and result) and write nothing.
    theirs = [sql for sql in tally.statements if '"policies_' in sql]
    assert len(theirs) == 3 * 2, theirs
    assert all(sql.lstrip().startswith("SELECT") for sql in theirs), theirs
