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
    "tests.support.proctree",  # own_tree
    "tests.support.ledger",  # ledger_anchor_dir (autouse), a flush that may empty the ledger
    "tests.support.oidc",  # oidc_provider, sso (a real OpenID provider)
]

# What `make test-fast` leaves out (`-m "not browser and not slow"`) beside the tests marked slow
# by hand: every test that starts a live server (daphne in a forked process) or other processes
# (dispatchers, a Celery worker), and the fault-injection folders (real processes, threads racing
# a stop). Marked by the fixtures they ask for and the folder they live in, so a new test that
# asks for a live server is slow without anyone having to remember it.
SLOW_FIXTURES = frozenset(
    {
        "live_stack",
        "live_stack_redis",
        "stack",
        "stack_for_command",
        "spawn_dispatcher",
        "celery_env",
        "oidc_provider",  # a real OpenID provider in a thread (tests/support/oidc.py)
    }
)
SLOW_FOLDERS = frozenset({"faults", "agent_e2e"})


@pytest.fixture(autouse=True, scope="session")
def _no_dispatch_kick_unless_a_test_installs_it():
    """With REDIS_URL in the environment `runs.apps` installs the kick on commit, and this
    process's own dispatcher would claim what any test enqueues: where dispatch happens is each
    test's choice (tests/dispatch/test_local_dispatch.py installs it), whatever the env says."""
    from runs.tasks import uninstall_dispatch_kick

    uninstall_dispatch_kick()
    yield


@pytest.fixture(autouse=True)
def _no_token_guesser_blocked_after_the_test():
    """Every test client calls from one address: a test that guesses bearer tokens must not
    leave it blocked for the next (the block is per process, api.ratelimit)."""
    yield
    from api.ratelimit import bearer_guessing_forget

    bearer_guessing_forget()


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    if "postgresql" not in engine and not os.environ.get("SAFESTOP_ALLOW_SQLITE_TESTS"):
        raise pytest.UsageError(
            "the suite runs on PostgreSQL: use `make test`, or set "
            "DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
        )


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.parent.name
        if folder in SLOW_FOLDERS or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
