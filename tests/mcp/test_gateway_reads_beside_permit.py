"""A read goes to the upstream beside its permit, and is answered only once the permit is granted
(DESIGN §15): while nothing could hold the call (no approval rule, never a policy), the call
takes the longer of the two, not their sum.

The permit is made to wait by holding the run's row lock from the test (the lock every permit
and every stop takes first), so what reaches the upstream meanwhile can be seen in its log.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest
from django.db import connection, transaction
from mcp.client.session import ClientSession

from gateway.sessions import _ProgressAfterPermit
from runs import services
from runs.actors import Actor
from runs.models import Approval, ExecutionRecord, LedgerEntry, Run
from runs.services import approval_rule_create
from tests.mcp.conftest import mcp_session
from tests.mcp.scenarios import db, eventually, reviewer_post, session_run_id
from tests.support.stack import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _read(path) -> str:
    return path.read_text() if path.exists() else ""


def _lock_waiters() -> int:
    """Backends waiting for a lock (here: for the run's row)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(cursor.fetchone()[0])


class HeldLock:
    """A lock `lock()` takes in a transaction of its own, on a thread of its own, held between
    `take` and `release`."""

    def __init__(self, lock: Callable[[], object]) -> None:
        self.lock = lock
        self._locked, self._release = threading.Event(), threading.Event()
        self._holder = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        try:
            with transaction.atomic():
                self.lock()
                self._locked.set()
                self._release.wait(30)
        finally:
            connection.close()

    def take(self) -> None:
        self._holder.start()
        assert self._locked.wait(10), "the test could not take its lock"

    def release(self) -> None:
        self._release.set()
        self._holder.join(10)


@asynccontextmanager
async def held(lock: Callable[[], object]) -> AsyncIterator[HeldLock]:
    holder = HeldLock(lock)
    await asyncio.to_thread(holder.take)
    try:
        yield holder
    finally:
        await asyncio.to_thread(holder.release)


def run_row_locked(run_id: str) -> AbstractAsyncContextManager[HeldLock]:
    """The run's row lock: the lock every permit and every stop takes first."""
    return held(lambda: Run.objects.select_for_update().get(pk=run_id))


def ledger_writes_locked() -> AbstractAsyncContextManager[HeldLock]:
    """No row can be added to the ledger meanwhile; reading it goes on (EXCLUSIVE conflicts with
    an INSERT's ROW EXCLUSIVE, not with a SELECT's ACCESS SHARE). A permit then takes its
    decision, and waits to write its record and ledger entry."""

    def lock() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {LedgerEntry._meta.db_table} IN EXCLUSIVE MODE")

    return held(lock)


@asynccontextmanager
async def warm_session(live_stack, agent_token) -> AsyncIterator[tuple[ClientSession, str]]:
    """A session on the writer upstream after one read: the session's first permit has told it
    whether anything could hold a call (here nothing, unless the test made a rule)."""
    async with mcp_session(f"{live_stack.url}/mcp/writer/", agent_token.raw) as session:
        await session.initialize()
        await session.call_tool("status", {"service": "warm"})
        yield session, await session_run_id()


async def warm_result_recorded(run_id: str) -> None:
    """The warm call's result committed: nothing of the session is left to write meanwhile."""
    await eventually(
        lambda: ExecutionRecord.objects.filter(run_id=run_id, execution_state="succeeded").exists(),
        "the warm call's result",
    )


def test_a_read_reaches_the_upstream_while_its_permit_waits(
    live_stack, slow_writer, agent_token, writer_log
) -> None:
    async def scenario() -> tuple[str, bool, str]:
        async with warm_session(live_stack, agent_token) as (session, run_id):
            async with run_row_locked(run_id) as lock:
                call = asyncio.create_task(session.call_tool("status", {"service": "billing"}))
                await eventually(lambda: "status billing" in _read(writer_log), "the read")
                await asyncio.sleep(0.3)
                answered_early = call.done()
                await asyncio.to_thread(lock.release)
            result = await asyncio.wait_for(call, 30)
            return result.content[0].text, answered_early, run_id

    text, answered_early, run_id = asyncio.run(scenario())
    assert not answered_early  # the upstream answered, the client waited for the permit
    assert text == "billing is up"
    calls = ExecutionRecord.objects.filter(run_id=run_id).order_by("id")
    assert [(c.arguments, c.side_effect, c.execution_state) for c in calls] == [
        ({"service": "warm"}, "none", "succeeded"),
        ({"service": "billing"}, "none", "succeeded"),
    ]


def test_a_read_is_answered_once_its_permit_is_decided_not_written(
    live_stack, slow_writer, agent_token
) -> None:
    """The permit's decision, under the run lock, is what the answer waits for; the record commits
    behind it, before the call's result."""

    async def scenario() -> tuple[str, list, str]:
        async with warm_session(live_stack, agent_token) as (session, run_id):
            await warm_result_recorded(run_id)
            async with ledger_writes_locked():
                result = await asyncio.wait_for(
                    session.call_tool("status", {"service": "billing"}), 20
                )
                written = await db(
                    lambda: list(
                        ExecutionRecord.objects.filter(run_id=run_id).values_list(
                            "arguments", flat=True
                        )
                    )
                )
            return result.content[0].text, written, run_id

    text, written_meanwhile, run_id = asyncio.run(scenario())
    assert text == "billing is up"
    assert written_meanwhile == [{"service": "warm"}]  # answered before its record committed
    wait_until(
        lambda: (
            ExecutionRecord.objects.filter(run_id=run_id, execution_state="succeeded").count() == 2
        ),
        timeout=20,
    )
    calls = ExecutionRecord.objects.filter(run_id=run_id).order_by("id")
    assert [(c.arguments, c.execution_state) for c in calls] == [
        ({"service": "warm"}, "succeeded"),
        ({"service": "billing"}, "succeeded"),
    ]


def test_a_stop_that_commits_first_refuses_the_read_forwarded_beside_it(
    live_stack, slow_writer, agent_token, writer_log
) -> None:
    async def scenario() -> tuple[object, str]:
        async with warm_session(live_stack, agent_token) as (session, run_id):
            async with run_row_locked(run_id) as lock:
                # The stop queues for the row first, then the read's permit behind it.
                stop = asyncio.create_task(db(lambda: _stop(run_id)))
                await eventually(lambda: _lock_waiters() >= 1, "the stop to wait for the lock")
                call = asyncio.create_task(session.call_tool("status", {"service": "billing"}))
                await eventually(lambda: "status billing" in _read(writer_log), "the read")
                await eventually(lambda: _lock_waiters() >= 2, "the permit to wait behind it")
                await asyncio.to_thread(lock.release)
            await stop
            return await asyncio.wait_for(call, 30), run_id

    result, run_id = asyncio.run(scenario())
    # The upstream answered, but the permit came after the stop: the model reads the refusal.
    assert result.is_error is True
    assert "The run was stopped by" in result.content[0].text
    assert "billing is up" not in result.content[0].text
    records = ExecutionRecord.objects.filter(run_id=run_id)
    assert [r.arguments for r in records] == [{"service": "warm"}]  # never permitted
    wait_until(lambda: Run.objects.get(pk=run_id).status == "stopped_cleanly", 20)


def test_a_stop_after_the_decision_finds_the_answered_read_in_flight(
    live_stack, slow_writer, agent_token
) -> None:
    """Answered on its permit's decision, the read's record is not yet written; a stop asked
    then waits for the run lock, which the permit keeps until its record commits, and finds the
    read as work in flight: drained with its result, the run stopped cleanly."""

    async def scenario() -> tuple[str, str, bool]:
        async with warm_session(live_stack, agent_token) as (session, run_id):
            await warm_result_recorded(run_id)
            async with ledger_writes_locked():
                result = await asyncio.wait_for(
                    session.call_tool("status", {"service": "billing"}), 20
                )
                stop = asyncio.create_task(db(lambda: _stop(run_id)))
                await eventually(lambda: _lock_waiters() >= 2, "the stop to wait for the run")
                stopped_meanwhile = stop.done()
            await asyncio.wait_for(stop, 30)
            return result.content[0].text, run_id, stopped_meanwhile

    text, run_id, stopped_meanwhile = asyncio.run(scenario())
    assert text == "billing is up"
    assert not stopped_meanwhile  # the stop came after the permit's commit, not between
    wait_until(lambda: Run.objects.get(pk=run_id).status == "stopped_cleanly", 20)
    calls = ExecutionRecord.objects.filter(run_id=run_id).order_by("id")
    assert [(c.arguments, c.permit_epoch, c.execution_state) for c in calls] == [
        ({"service": "warm"}, calls[0].permit_epoch, "succeeded"),
        ({"service": "billing"}, calls[0].permit_epoch, "succeeded"),
    ]


def test_a_team_with_a_rule_forwards_nothing_before_its_permit(
    live_stack, slow_writer, agent_token, writer_log, team
) -> None:
    # A rule that holds another tool: a status read is never held, but a rule exists, so the
    # gateway does not guess which calls it would hold.
    approval_rule_create(
        team_id=team.pk,
        actor=Actor.system("test"),
        name="deploys need a person",
        tool_glob="deploy",
    )

    async def scenario() -> tuple[str, bool]:
        async with warm_session(live_stack, agent_token) as (session, run_id):
            async with run_row_locked(run_id) as lock:
                call = asyncio.create_task(session.call_tool("status", {"service": "billing"}))
                await eventually(lambda: _lock_waiters() >= 1, "the permit to wait")
                await asyncio.sleep(0.5)
                reached_early = "status billing" in _read(writer_log)
                await asyncio.to_thread(lock.release)
            result = await asyncio.wait_for(call, 30)
            return result.content[0].text, reached_early

    text, reached_early = asyncio.run(scenario())
    assert not reached_early
    assert text == "billing is up"


@pytest.mark.parametrize(
    ("edited", "answer", "reads"),
    [
        ({"service": "ledger"}, "ledger is up", ["status billing", "status ledger"]),
        (None, "billing is up", ["status billing", "status billing"]),
    ],
    ids=["edited", "as-asked"],
)
def test_a_read_held_by_a_rule_added_meanwhile_runs_afresh_once_approved(
    live_stack, slow_writer, agent_token, reviewer_token, writer_log, team, edited, answer, reads
) -> None:
    """Its early answer is kept back, and not given even when approved as asked: it is as old
    as the reviewer's wait. Approved, the call runs again, with the reviewer's arguments."""

    async def scenario() -> str:
        async with warm_session(live_stack, agent_token) as (session, _):
            # The session's last permit said nothing could hold a call; a rule comes after it.
            await db(
                lambda: approval_rule_create(
                    team_id=team.pk,
                    actor=Actor.system("test"),
                    name="status needs a person",
                    tool_glob="status",
                )
            )
            call = asyncio.create_task(session.call_tool("status", {"service": "billing"}))
            approval = await eventually(_waiting_approval, "the held call's approval")
            await eventually(lambda: "status billing" in _read(writer_log), "the early read")
            await asyncio.sleep(0.3)
            assert not call.done()  # held: the early answer is not given
            decision = {"decision": "approve", "message": ""}
            if edited is not None:
                decision["arguments"] = edited
            decided = await reviewer_post(
                live_stack.url,
                reviewer_token,
                f"/api/v1/approvals/{approval.pk}/decide/",
                decision,
            )
            assert decided.status_code == 200, decided.text
            result = await asyncio.wait_for(call, 30)
            return result.content[0].text

    assert asyncio.run(scenario()) == answer
    # Forwarded beside its permit before the rule held it, then again once approved.
    log = _read(writer_log).splitlines()  # "pid …", "status warm", then this call's reads
    assert [line for line in log if line.startswith("status ")][1:] == reads


def test_progress_waits_for_the_permit_and_keeps_its_order() -> None:
    heard: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        heard.append((value, total, message))

    async def scenario() -> None:
        kept = _ProgressAfterPermit(progress)
        await kept.send(1, 3, "one")
        await kept.send(2, 3, None)
        assert heard == []  # nothing before the permit
        await kept.release()
        await kept.send(3, 3, "three")

    asyncio.run(scenario())
    assert heard == [(1, 3, "one"), (2, 3, None), (3, 3, "three")]


def _stop(run_id: str) -> None:
    services.run_stop(run_id=run_id, reason="user_stop", actor=Actor.system("reviewer-bot"))


def _waiting_approval() -> Approval | None:
    return Approval.objects.filter(status="waiting").first()
