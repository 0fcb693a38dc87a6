"""The suite runs on PostgreSQL (`make test`). Shared fixtures and helpers live in tests/support/:
the fixture modules are registered here, helpers are imported from there (never from another
test folder or a conftest)."""

from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.support.isolation",  # this session's own Redis database
    "tests.support.accounts",  # team, alice, bob, charlie, outsider, tokens, actors
    "tests.support.livestack",  # live_stack, live_stack_redis
    "tests.support.stack",  # receiver (the demo's), stack
    "tests.support.live_sockets",  # fresh_channel_layer
]


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine and not os.environ.get("SAFESTOP_ALLOW_SQLITE_TESTS"):
        raise pytest.UsageError(
            "the suite runs on PostgreSQL: use `make test`, or set "
            "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
        )
