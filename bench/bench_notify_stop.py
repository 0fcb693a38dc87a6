"""A stop's latency with and without a black-hole notification target (DESIGN §11).

Standalone (not in `run_all.py` yet):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/bench_notify_stop.py

Creates its own test database (`test_safestop_bench_notify`), then times `run_stop` — a running
run whose worker holds no live lease, so the stop settles dirty (a write in flight) in the same
transaction and writes its `run.stopped_dirty` notification rows — 1. with no channel, 2. with
three channels whose target accepts TCP connections and never answers. The stop only inserts
rows; the sender (timed apart, afterwards) is what waits on the target. Figures only.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("SAFESTOP_TEST_DB_NAME", "test_safestop_bench_notify")

import django  # noqa: E402

django.setup()

from bench.common import format_table, latency_row  # noqa: E402

STOPS = int(os.environ.get("BENCH_STOPS", 200))


def _black_hole() -> tuple[str, list[socket.socket]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            held.append(conn)  # never read, never answered

    threading.Thread(target=accept, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", held


def _dirty_stop_ms(team, n: int) -> float:  # type: ignore[no-untyped-def]
    from django.utils import timezone

    from runs import services
    from runs.actors import Actor
    from runs.models import Lease

    agent = Actor("api_client", "1", "bench-agent")
    run = services.run_create(team=team, title=f"bench {n}", agent="bench-bot", actor=agent)
    lease = services.lease_acquire(run_id=run.pk, worker_id="w", ttl_seconds=600, actor=agent)
    services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id=f"deploy_{n}",
        tool="deploy.push",
        side_effect="write",
        actor=agent,
    )
    # The worker is gone (its lease lapsed): the stop settles in its own transaction, dirty.
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    started = time.perf_counter()
    services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.system("bench"))
    return (time.perf_counter() - started) * 1000


def main() -> None:
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment

    from notifications.models import Delivery
    from notifications.services import channel_create, deliveries_send_due
    from runs.actors import Actor
    from runs.tokens import team_ensure

    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        host, _held = _black_hole()
        settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [host]
        settings.SAFESTOP_WEBHOOK_CONNECT_TIMEOUT = 1
        settings.SAFESTOP_WEBHOOK_READ_TIMEOUT = 1
        team = team_ensure(slug="bench", name="Bench")
        for n in range(20):  # warm up
            _dirty_stop_ms(team, -n - 1)
        quiet = [_dirty_stop_ms(team, n) for n in range(STOPS)]
        for n in range(3):
            channel_create(
                team=team,
                name=f"black hole {n}",
                kind="webhook",
                target=f"http://{host}/hook/{n}",
                actor=Actor.system("bench"),
            )
        holed = [_dirty_stop_ms(team, STOPS + n) for n in range(STOPS)]
        queued = Delivery.objects.count()
        started = time.perf_counter()
        deliveries_send_due(limit=3, sender="bench")
        send_ms = (time.perf_counter() - started) * 1000
        rows = [
            latency_row("notify", "dirty stop, no channel", quiet),
            latency_row(
                "notify",
                "dirty stop, 3 black-hole channels",
                holed,
                note=f"{queued} deliveries queued by the stops",
            ),
            latency_row(
                "notify", "sender: 3 sends to the black hole", [send_ms], note="1 s timeouts"
            ),
        ]
        print(format_table(rows))
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
