"""Shared by the fault, agent end-to-end and demo tests: a live server (daphne + background
loop, against the test database), the demo webhook receiver on its allow-list, tokens, and
small probes of the process table and the records. The `receiver` and `stack` fixtures are
registered for the whole suite (`pytest_plugins` in tests/conftest.py); tests/dispatch/ has its
own `receiver`.

Everything is real: PostgreSQL, HTTP and websockets to a forked daphne, OS processes. Nothing
here looks at the UI.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from console.demo.receiver import WebhookReceiver
from runs.models import LedgerEntry, Run
from safestop_agent import AgentRun, SafestopClient
from tests.support.livestack import LiveStack, start_live_stack

T = TypeVar("T")


@dataclass
class Stack:
    live: LiveStack
    receiver: WebhookReceiver
    agent_raw: str
    reviewer_raw: str

    @property
    def url(self) -> str:
        return self.live.url

    def agent(self) -> SafestopClient:
        return SafestopClient(self.live.url, self.agent_raw)

    def reviewer(self) -> SafestopClient:
        return SafestopClient(self.live.url, self.reviewer_raw)


@pytest.fixture
def receiver(settings: Any) -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as server:
        settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [server.host]
        yield server


def stack_start(
    django_db_blocker: Any,
    receiver: WebhookReceiver,
    agent_raw: str,
    reviewer_raw: str,
    **overrides: Any,
) -> Iterator[Stack]:
    settings_overrides = {
        "SAFESTOP_WEBHOOK_ALLOWED_HOSTS": [receiver.host],
        "SAFESTOP_BACKGROUND_INTERVAL": 0.1,
        **overrides,
    }
    with start_live_stack(
        django_db_blocker, background=True, settings_overrides=settings_overrides
    ) as live:
        yield Stack(live, receiver, agent_raw, reviewer_raw)


@pytest.fixture
def stack(
    transactional_db: None,
    django_db_blocker: Any,
    receiver: WebhookReceiver,
    agent_token: Any,
    reviewer_token: Any,
) -> Iterator[Stack]:
    """A live server with its background loop (dispatcher, reapers, drain watchdog) running."""
    yield from stack_start(django_db_blocker, receiver, agent_token.raw, reviewer_token.raw)


# --------------------------------------------------------------------------------------------
# probes


def wait_until(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def status(run_id: str) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run_id)


def wait_status(run_id: str, *statuses: str, timeout: float = 10.0) -> Run:
    wait_until(lambda: status(run_id) in statuses, timeout, what=f"{run_id} to reach {statuses}")
    return Run.objects.get(pk=run_id)


def alive(pid: int) -> bool:
    """True if `pid` is a live process (not a zombie waiting to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pids(path: str, count: int, timeout: float = 10.0) -> list[int]:
    """Pids a shell tool wrote to `path`, one per line, once `count` of them are there."""

    def ready() -> list[int] | None:
        try:
            with open(path) as handle:
                pids = [int(line) for line in handle.read().split()]
        except (OSError, ValueError):
            return None
        return pids if len(pids) >= count else None

    return wait_until(ready, timeout, what=f"{count} pids in {path}")


def actions(run_id: str) -> list[str]:
    return list(
        LedgerEntry.objects.filter(run_id=run_id)
        .order_by("run_seq")
        .values_list("action", flat=True)
    )


# --------------------------------------------------------------------------------------------
# workers


class WorkerThread(threading.Thread):
    """Runs a worker function in a thread and keeps its result or exception for the test."""

    def __init__(self, fn: Callable[[], Any], name: str = "fault-worker") -> None:
        super().__init__(name=name, daemon=True)
        self._fn = fn
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as error:  # the test decides what an exception means
            self.error = error

    def outcome(self, timeout: float = 15.0) -> Any:
        self.join(timeout)
        if self.is_alive():
            raise AssertionError(f"worker {self.name} still running after {timeout}s")
        if self.error is not None:
            raise self.error
        return self.value


@contextmanager
def leased(
    client: SafestopClient,
    run_id: str,
    worker_id: str = "worker-1",
    ttl: float = 10.0,
    into: list[AgentRun] | None = None,
) -> Iterator[AgentRun]:
    """`client.lease(...)`, entered only once the push channel is connected (so a stop made
    right after reaches the worker by push, not at its next heartbeat). `into` keeps the run
    for the test: a stopped block exits quietly, so nothing after it returns."""
    with client.lease(run_id, worker_id, ttl_seconds=ttl) as run:
        if into is not None:
            into.append(run)
        listener = run._listener  # the push listener: connected is an Event
        assert listener is not None and listener.connected.wait(10), "push channel never connected"
        yield run


def planned(*steps: tuple[str, str]) -> list[dict[str, str]]:
    return [{"key": key, "name": key.replace("_", " "), "kind": kind} for key, kind in steps]


def racer(
    barrier: threading.Barrier,
    fn: Callable[[], Any],
    results: dict[str, Any],
    name: str,
    head_start: float = 0.0,
) -> threading.Thread:
    """A thread that waits at `barrier`, sleeps `head_start`, calls `fn` and stores its answer (or
    exception) in `results[name]`; its own PostgreSQL session is closed when it ends."""
    from django.db import connection

    def body() -> None:
        try:
            barrier.wait(10)
            time.sleep(head_start)
            results[name] = fn()
        except Exception as error:
            results[name] = error
        finally:
            connection.close()

    return threading.Thread(target=body, name=name)
