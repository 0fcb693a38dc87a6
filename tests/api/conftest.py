"""The API tests' `api` fixture (tests/support/api.py has the helpers)."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.support.api import Api


@pytest.fixture
def api(client: Client) -> Api:
    return Api(client)
