"""Fairness of the notification sender across teams, and what the fair claim costs.

Standalone (not in `run_all.py`):

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/bench_notify_fairness.py

Creates its own test database (`test_safestop_bench_fairness`). One team floods
`BENCH_FLOOD` (3,000) due deliveries to a local HTTP receiver that answers 200 at once; another
team then queues one. Prints how many sends (and how long) the quiet team's delivery waited,
and the time of one claim (`deliveries_claim_due`, limit 5) with the flood pending, spread over 1
and over 50 teams. Figures only.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
os.environ.setdefault("SAFESTOP_TEST_DB_NAME", "test_safestop_bench_fairness")

import django  # noqa: E402

django.setup()

from bench.common import format_table, latency_row  # noqa: E402

FLOOD = int(os.environ.get("BENCH_FLOOD", 3000))


def _receiver() -> tuple[str, list[str]]:
    paths: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            paths.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"127.0.0.1:{server.server_address[1]}", paths


def main() -> None:
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_test_environment
    from django.utils import timezone

    from notifications.models import Delivery, DeliveryStatus
    from notifications.services import channel_create, deliveries_claim_due, deliveries_send_due
    from runs.actors import Actor
    from runs.tokens import team_ensure

    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        host, paths = _receiver()
        settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = [host]
        admin = Actor.system("bench")
        teams = [team_ensure(slug=f"team{n}", name=f"Team {n}") for n in range(50)]
        channels = [
            channel_create(
                team=team,
                name="hook",
                kind="webhook",
                target=f"http://{host}/{team.slug}",
                actor=admin,
            ).channel
            for team in teams
        ]

        def flood(spread: int) -> None:
            Delivery.objects.all().delete()
            earlier = timezone.now() - timedelta(minutes=10)
            Delivery.objects.bulk_create(
                (
                    Delivery(
                        team=teams[n % spread],
                        channel=channels[n % spread],
                        event="approval.waiting",
                        event_key=f"flood:{n}",
                        message={"title": f"flood {n}", "text": "", "link": ""},
                        next_attempt_at=earlier,
                    )
                    for n in range(FLOOD)
                ),
                batch_size=1000,
            )

        # 1. how long the quiet team waits behind the flood
        flood(1)
        quiet = teams[-1]
        Delivery.objects.create(
            team=quiet,
            channel=channels[-1],
            event="run.stopped_dirty",
            event_key="quiet",
            message={"title": "quiet"},
            next_attempt_at=timezone.now(),
        )
        started = time.perf_counter()
        while f"/{quiet.slug}" not in paths:
            deliveries_send_due(limit=5, sender="bench")
        waited_ms = (time.perf_counter() - started) * 1000
        sends_before = paths.index(f"/{quiet.slug}")

        # 2. one claim's cost with the flood pending
        rows = [
            latency_row(
                "notify",
                "quiet team's delivery behind a flood",
                [waited_ms],
                note=f"{sends_before} sends before it, {FLOOD} flooded",
            )
        ]
        print(f"sends before the quiet team's delivery: {sends_before} (of {FLOOD} flooded)")
        for spread in (1, 50):
            flood(spread)
            timings = []
            for n in range(40):
                started = time.perf_counter()
                deliveries_claim_due(limit=5, claimer=f"c{n}")
                timings.append((time.perf_counter() - started) * 1000)
            Delivery.objects.filter(status=DeliveryStatus.SENDING).update(
                status=DeliveryStatus.PENDING
            )
            rows.append(
                latency_row("notify", f"claim 5 of {FLOOD} pending, {spread} team(s)", timings)
            )
        print(format_table(rows))
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


if __name__ == "__main__":
    main()
