"""The gateway's database work: threads that keep their connection, and each session's lane.

A session's writes — a `tools/call`'s permit, the result of the call before it — go through its
`Lane`: in the order they were asked, on one thread hop at a time, the jobs queued meanwhile
all in the next hop. Two reasons:

- order: a call's result is committed before the session's next permit is asked, so the permit
  sees what that result changed (a policy counting failures in a row, `policies.evaluate`);
  run on threads of their own, the two raced for the run's lock;
- cost: a hop hands the work to a thread and the answer back to the event loop, each a wake-up
  that waits for a core on a loaded machine, and the two transactions no longer queue on the
  run's row lock in PostgreSQL, one of them holding a connection idle meanwhile.

The run-change events of a job can be kept back (`held`) and published later, out of the lane
(`News`): the agent's call never waits for the console's frames.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connection

from runs import notify

# The gateway's database work runs on threads of its own, each keeping its connection between
# calls: a tool call's permit is on the path of every call an agent makes, and handing the
# connection back to the pool after each call (as `database_sync_to_async` does) cost a pool
# round trip and a health check per call. Not the one thread Django's sync work shares by
# default either: one session's lane, another session's and a heartbeat need not queue behind
# each other.
_DB_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mcp-gateway-db")


def _keeping_connection(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DatabaseError:
            _drop_broken_connection()
            raise

    return call


def _drop_broken_connection() -> None:
    # A connection the server dropped is not kept: the next call takes a fresh one.
    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()


def db(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """`fn` on one of the gateway's database threads (work outside any session's lane)."""
    return sync_to_async(_keeping_connection(fn), thread_sensitive=False, executor=_DB_THREADS)


@dataclass
class _Job:
    fn: Callable[[], Any]
    future: asyncio.Future[Any]
    held: bool


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its caller gave up (cancelled): the work is done all the same
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _run_jobs(jobs: list[_Job], loop: asyncio.AbstractEventLoop) -> None:
    """On a database thread: each job in turn, its caller answered as soon as it is done."""
    for job in jobs:
        events: list[dict[str, Any]] = []
        try:
            if job.held:
                with notify.held() as events:
                    result: Any = job.fn()
                result = (result, events)
            else:
                result = job.fn()
        except Exception as error:
            if isinstance(error, DatabaseError):
                _drop_broken_connection()
            notify.deliver(events)  # what committed before the refusal is still news
            loop.call_soon_threadsafe(_settle, job.future, None, error)
            continue
        loop.call_soon_threadsafe(_settle, job.future, result, None)


class Lane:
    """One session's database jobs, in order; see the module's docstring."""

    def __init__(self) -> None:
        self._jobs: list[_Job] = []
        self._busy = False
        self._idle = asyncio.Event()
        self._idle.set()

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, held: bool = False, **kwargs: Any
    ) -> asyncio.Future[Any]:
        """Queue `fn(*args, **kwargs)`; the future answers its result — with `held`, the pair
        (result, the run-change events it committed, not yet published).

        An idle lane hands the job to a thread at once, before the caller goes on: a read sent
        upstream beside its permit then has its permit started first."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.append(_Job(functools.partial(fn, *args, **kwargs), future, held))
        if not self._busy:
            self._busy = True
            self._idle.clear()
            self._hop(loop)
        return future

    def _hop(self, loop: asyncio.AbstractEventLoop) -> None:
        # Straight to the executor (no task, no `sync_to_async` wrapper): the jobs carry no
        # context of the request, and each job answers its own future from the thread.
        jobs, self._jobs = self._jobs, []
        hop = loop.run_in_executor(_DB_THREADS, _run_jobs, jobs, loop)
        hop.add_done_callback(lambda _: self._next(loop))

    def _next(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._jobs and not loop.is_closed():
            self._hop(loop)
            return
        for job in self._jobs:  # only when the loop is closing
            job.future.cancel()
        self._jobs = []
        self._busy = False
        self._idle.set()

    async def idle(self) -> None:
        """Until every job asked so far is done."""
        await self._idle.wait()


class News:
    """Run-change events kept back from a session's jobs, published off the call's path.

    A call's permit and its result each commit a change; when the result follows within
    `delay`, both are published in one hop (one wake-up of the publisher, one kick of the
    background work instead of two). A call that runs longer gets its permit's frames after
    `delay`: a viewer sees the call running while it runs.
    """

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._events: list[dict[str, Any]] = []
        self._timer: asyncio.TimerHandle | None = None

    def later(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        self._events.extend(events)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay, self.now)

    def now(self, events: list[dict[str, Any]] | None = None) -> None:
        if events:
            self._events.extend(events)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._events:
            return
        batch, self._events = self._events, []
        publish = asyncio.ensure_future(db(notify.deliver)(batch))
        _PUBLISHING.add(publish)
        publish.add_done_callback(_PUBLISHING.discard)


# Publishing tasks in flight (a reference each, so none is collected before it is done).
_PUBLISHING: set[asyncio.Future[Any]] = set()
