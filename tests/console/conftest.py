"""Console test helpers: logged-in clients for the shared users (see tests/conftest.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def as_admin(alice) -> Client:
    return _client_for(alice)


@pytest.fixture
def as_reviewer(bob) -> Client:
    return _client_for(bob)


@pytest.fixture
def as_viewer(charlie) -> Client:
    return _client_for(charlie)


@pytest.fixture
def as_outsider(outsider) -> Client:
    return _client_for(outsider)


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user(
        username="root", password="pw-root", is_staff=True, is_superuser=True
    )


@pytest.fixture
def as_staff(staff) -> Client:
    return _client_for(staff)


# The browser sockets' access re-check timer (tests/console/test_live_access.py, test_live_session.py)


@pytest.fixture
def no_timer(settings) -> None:
    """Only the `access.changed` message can act (the timer is off)."""
    settings.SAFESTOP_WS_ACCESS_RECHECK_SECONDS = 0


@pytest.fixture
def fast_timer(settings) -> float:
    settings.SAFESTOP_WS_ACCESS_RECHECK_SECONDS = 0.5
    return 0.5
