"""Two suites on one machine never share state: each pytest session has its own PostgreSQL test
database and its own Redis database.

- The database: `SAFESTOP_TEST_DB_NAME`, else `test_safestop_<pid of pytest>` (console/settings.py).
- Redis: `SAFESTOP_TEST_REDIS_URL` (which every xdist worker would share: set it only without
  `-n`), else this plugin claims a free database number (1-15; 0 is
  `make run`'s) for the session and exports the URL in `SAFESTOP_TEST_REDIS_URL`, so test modules,
  the live servers and child processes (Celery worker, dispatchers) all use the same one. Under
  `pytest -n N` (`make test`) each worker is a session of its own and claims its own. A claim
  is a key in the database itself, written with SET NX (two sessions starting together cannot
  take the same number) and an expiry; a claim whose owner process is gone is taken over.

Every test that talks to Redis asks `suite_redis_url()`.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

ENV = "SAFESTOP_TEST_REDIS_URL"
REDIS_SERVER = os.environ.get("SAFESTOP_TEST_REDIS_SERVER", "redis://127.0.0.1:6379")
CLAIM_KEY = "safestop:test-suite"
CLAIM_SECONDS = 6 * 3600
_claimed: dict[str, str] = {}


def suite_redis_url() -> str:
    """The Redis database of this test session (see the module docstring)."""
    return os.environ.get(ENV) or f"{REDIS_SERVER}/0"


def _owner_alive(owner: bytes | None) -> bool:
    if owner is None:
        return False
    host, _, pid = owner.decode(errors="replace").rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's claim: wait for its expiry
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take_over(client: Any, owner: str) -> bool:
    """Claim the database if its owner is gone, unless another session changed the key meanwhile."""
    import redis

    with client.pipeline() as pipe:
        try:
            pipe.watch(CLAIM_KEY)
            if _owner_alive(pipe.get(CLAIM_KEY)):
                return False
            pipe.multi()
            pipe.set(CLAIM_KEY, owner, ex=CLAIM_SECONDS)
            pipe.execute()
            return True
        except redis.WatchError:
            return False


def _claim() -> str | None:
    import redis

    owner = f"{socket.gethostname()}:{os.getpid()}"
    for number in range(1, 16):
        url = f"{REDIS_SERVER}/{number}"
        client = redis.Redis.from_url(url, socket_timeout=2)
        try:
            if client.set(CLAIM_KEY, owner, nx=True, ex=CLAIM_SECONDS) or _take_over(client, owner):
                _claimed.update(url=url, owner=owner)
                return url
        except redis.RedisError:
            return None  # Redis is down: the tests that need it fail, saying so
        finally:
            client.close()
    raise pytest.UsageError(
        f"every Redis database 1-15 on {REDIS_SERVER} is claimed by a running test session: "
        f"set {ENV}=redis://.../N"
    )


def _xdist_controller(config: pytest.Config) -> bool:
    """`pytest -n N`: the process that only hands tests to its workers. Its workers inherit its
    environment, so a database it claimed would be shared by all of them: each claims its own."""
    return bool(getattr(config.option, "numprocesses", None)) and not os.environ.get(
        "PYTEST_XDIST_WORKER"
    )


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(ENV) or _xdist_controller(config):
        return
    url = _claim()
    if url is not None:
        os.environ[ENV] = url


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _claimed:
        return
    import redis

    client = redis.Redis.from_url(_claimed["url"], socket_timeout=2)
    try:
        if client.get(CLAIM_KEY) == _claimed["owner"].encode():
            client.delete(CLAIM_KEY)
    except redis.RedisError:
        pass
    finally:
        client.close()
        os.environ.pop(ENV, None)
        _claimed.clear()
