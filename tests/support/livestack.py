"""A real safestop server for tests: daphne serving `console.asgi.application` (HTTP, the agent
and browser websockets, static files) in a forked process, on a free port, against the pytest
test database.

The fixtures are registered for the whole suite (`pytest_plugins` in tests/conftest.py)::

    def test_push(live_stack):
        httpx.post(f"{live_stack.url}/api/v1/runs/{run_id}/cancel/", ...)
        websockets.sync.client.connect(live_stack.agent_ws_url(run_id), ...)

Fixtures (function-scoped; both require `transactional_db`, so rows the test commits are
visible to the server and rows the server commits are visible to the test, and the tables are
flushed after the server has stopped):

- `live_stack` — the in-memory channel layer. It lives *inside the server process* only, so a
  push (stop signal, run updates) reaches websockets only when the change is made through the
  server: trigger stops over HTTP (`POST {url}/api/v1/runs/<id>/cancel/`). A service called
  directly in the test process commits, but its push goes nowhere (SETUP pitfall 7).
- `live_stack_redis` — the Redis channel layers (core for agents, Pub/Sub for browsers, as in
  console/settings.py), in the server *and* the test process (the session's Redis database,
  tests/support/isolation.py, and a prefix unique to the test), so a service called in the test process also pushes to
  the server's websockets. Skipped when Redis is not reachable. Its rate limiter and background
  work are unaffected: only CHANNEL_LAYERS changes, REDIS_URL stays as configured.

Both yield a `LiveStack`: `.url` (`http://127.0.0.1:PORT`), `.ws_url` (`ws://127.0.0.1:PORT`),
`.port`, `.agent_ws_url(run_id)`, `.channel_layer` ("memory" | "redis").

For other needs (the background loop for dispatch / drain deadlines, different settings),
build your own fixture on `start_live_stack(...)`::

    @pytest.fixture
    def live_stack_with_watchdog(transactional_db, django_db_blocker):
        with start_live_stack(django_db_blocker, background=True,
                              settings_overrides={"SAFESTOP_DRAIN_DEADLINE_SECONDS": 2}) as stack:
            yield stack

How the forked server is made safe (SETUP pitfalls 4-7):
1. fork, not spawn: the child inherits the configured settings, including the test database's
   name, which is also set explicitly on `DATABASES["default"]["NAME"]`;
2. in the child, before daphne starts: a fresh asgiref single-thread executor and thread-local
   state (the parent's do not survive fork), fresh Django connection handles and psycopg pools
   (the parent's sockets are kept referenced and never closed from the child — closing them
   would end the parent's own database session), and an empty channel-layer cache;
3. pytest-django's database blocker is lifted in the child;
4. teardown terminates the process (then kills it if needed) *before* `transactional_db`
   flushes the tables, so no server session holds a lock the flush waits on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pytest
from daphne.testing import DaphneProcess

from tests.support.isolation import suite_redis_url

_HOST = "127.0.0.1"
_STARTUP_SECONDS = 30.0
# Objects inherited from the parent that the child must keep alive: if they were garbage
# collected in the child, their finalisers would close sockets the parent is still using.
_INHERITED: list[Any] = []


@dataclass
class LiveStack:
    port: int
    channel_layer: str
    process: Any = field(repr=False)
    host: str = _HOST

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def agent_ws_url(self, run_id: str) -> str:
        return f"{self.ws_url}/ws/agent/runs/{run_id}/"


def _application() -> Any:
    from console.asgi import application

    return application


def _reset_inherited_state(db_name: str, overrides: dict[str, Any]) -> None:
    """Runs first thing in the forked child (see the module docstring, step 2)."""
    import threading

    from asgiref.local import Local
    from asgiref.sync import AsyncToSync, SyncToAsync
    from channels.layers import channel_layers
    from django.conf import settings
    from django.db import connections

    SyncToAsync.single_thread_executor = ThreadPoolExecutor(max_workers=1)
    SyncToAsync.threadlocal = threading.local()
    AsyncToSync.loop_thread_executors = {}
    AsyncToSync.executors = Local()

    for name, value in overrides.items():
        setattr(settings, name, value)

    settings.DATABASES["default"]["NAME"] = db_name
    _INHERITED.append(connections._connections)
    connections._connections = Local(connections.thread_critical)
    connections.settings["default"]["NAME"] = db_name
    with contextlib.suppress(ImportError):
        from django.db.backends.postgresql.base import DatabaseWrapper

        _INHERITED.append(DatabaseWrapper._connection_pools)
        DatabaseWrapper._connection_pools = {}

    _INHERITED.append(dict(channel_layers.backends))
    channel_layers.backends = {}


class _StackProcess(DaphneProcess):
    def __init__(
        self, *, db_name: str, overrides: dict[str, Any], blocker: Any, background: bool
    ) -> None:
        super().__init__(
            _HOST, _application, kwargs={"verbosity": 0}, setup=self._setup, teardown=self._teardown
        )
        self.db_name = db_name
        self.overrides = overrides
        self.blocker = blocker
        self.background = background
        self._loop: Any = None

    def run(self) -> None:
        _reset_inherited_state(self.db_name, self.overrides)
        if self.blocker is not None:
            self.blocker.unblock()
        # Die on SIGTERM without running finalisers (they would touch inherited sockets).
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        super().run()

    def _setup(self) -> None:
        if not self.background:
            return
        import asyncio

        from console import realtime
        from runs.background import start_background_thread

        realtime.bind_event_loop(asyncio.get_event_loop())
        self._loop = start_background_thread()

    def _teardown(self) -> None:
        if self._loop is not None:
            self._loop.stop()


@contextlib.contextmanager
def start_live_stack(
    django_db_blocker: Any = None,
    *,
    channel_layer: str = "memory",
    background: bool = False,
    settings_overrides: dict[str, Any] | None = None,
) -> Iterator[LiveStack]:
    """Start a server (see the module docstring); stop it on exit. Needs `transactional_db`."""
    from django.conf import settings
    from django.db import connections

    overrides = dict(settings_overrides or {})
    db_name = connections["default"].settings_dict["NAME"]
    if channel_layer == "redis":
        overrides["CHANNEL_LAYERS"] = settings.CHANNEL_LAYERS
    process = _StackProcess(
        db_name=db_name, overrides=overrides, blocker=django_db_blocker, background=background
    )
    process.daemon = True
    process.start()
    try:
        _wait_until_ready(process)
        yield LiveStack(port=process.port.value, channel_layer=channel_layer, process=process)
    finally:
        process.terminate()
        process.join(10)
        if process.is_alive():
            process.kill()
            process.join(5)


def _wait_until_ready(process: _StackProcess) -> None:
    deadline = time.monotonic() + _STARTUP_SECONDS
    while not process.ready.wait(0.05):
        failed = not process.errors.empty() or not process.is_alive()
        if failed or time.monotonic() > deadline:
            error = process.errors.get(timeout=1) if not process.errors.empty() else None
            raise RuntimeError(
                f"the live server did not start: {error[1] if error else 'no error reported'}"
            )


@pytest.fixture
def live_stack(transactional_db: None, django_db_blocker: Any) -> Iterator[LiveStack]:
    """A live server with the in-memory channel layer: make pushes through its HTTP API."""
    with start_live_stack(django_db_blocker) as stack:
        yield stack


def redis_reachable(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or _HOST, parts.port or 6379), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def live_stack_redis(transactional_db: None, django_db_blocker: Any) -> Iterator[LiveStack]:
    """A live server whose channel layer is Redis, shared with the test process."""
    from channels.layers import channel_layers
    from django.test import override_settings

    url = suite_redis_url()
    if not redis_reachable(url):
        pytest.fail(f"Redis is not reachable at {url}: run `make services`")
    prefix = f"livestack-{uuid.uuid4().hex[:12]}"
    # The two aliases of console/settings.py, with its socket timeout (without it an agent socket
    # idle for 5 s dies: django/channels_redis#422): agents on the core layer, browsers on
    # Pub/Sub (whose channels ignore the database number: the prefix keeps tests apart).
    host = {"address": url, "socket_timeout": 15}
    layers = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [host], "prefix": prefix},
        },
        "viewers": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [host], "prefix": prefix},
        },
    }
    saved = dict(channel_layers.backends)
    with override_settings(CHANNEL_LAYERS=layers):
        channel_layers.backends = {}
        try:
            with start_live_stack(django_db_blocker, channel_layer="redis") as stack:
                yield stack
        finally:
            channel_layers.backends = saved
