"""Helpers of the browser tests (tests/browser/conftest.py has their fixtures)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a service call off the Playwright loop's thread (it may publish with async_to_sync)."""
    from django.db import connections

    def call() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()  # the worker thread's own connection, or the test DB cannot be dropped

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()
