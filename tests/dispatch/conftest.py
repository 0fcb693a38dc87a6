"""Fixtures for the side-effect gateway: a live webhook receiver, and real OS processes
(dispatchers, a Celery worker) that share the pytest test database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dispatch.race import DispatcherProcess
from tests.support.dispatch_receiver import WebhookReceiver


@pytest.fixture
def receiver(settings) -> Iterator[WebhookReceiver]:
    """A real HTTP receiver on 127.0.0.1, on the webhook allow-list of this process."""
    server = WebhookReceiver().start()
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [server.host]
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def spawn_dispatcher(receiver: WebhookReceiver) -> Iterator:
    """Start dispatcher processes; they are stopped (or already killed) before the database is
    flushed, so no child holds a connection or a lock during teardown."""
    started: list[DispatcherProcess] = []

    def spawn() -> DispatcherProcess:
        process = DispatcherProcess(allowed_hosts=receiver.host)
        started.append(process)
        return process

    try:
        yield spawn
    finally:
        for process in started:
            process.close()
