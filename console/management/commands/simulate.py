"""`python manage.py simulate --url URL [--runs N] [--duration S]`: the living demo.

1. creates its own agent and reviewer tokens for each demo team (a fresh name per start; the
   raw secrets live only in this process);
2. starts the local webhook receiver on 127.0.0.1 (`--receiver-port`, default 8099, any free
   port if that one is busy) — the server must allow it: `serve` does, otherwise add it to
   SAFESTOP_WEBHOOK_ALLOWED_HOSTS;
3. waits for the server to answer, then drives N concurrent agent runs through
   `safestop_agent` over HTTP and websockets (`console.demo.simulator`), new ones arriving
   as old ones end, plus workers whose payment, deploy and customer-email calls wait for a
   reviewer's approval (the demo teams' rules hold them; an approver bot decides what nobody
   decided within `--approval-grace` seconds);
4. on SIGTERM / Ctrl-C (or after `--duration`): stops its live runs through the API, lets the
   workers drain, and exits 0.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from console.demo.accounts import DEMO_TEAMS
from console.demo.receiver import DEFAULT_PORT, WebhookReceiver
from console.demo.simulator import Simulator, SimulatorConfig, TeamCredentials
from console.demo.words import LANGUAGES
from runs.tokens import api_token_create


class Command(BaseCommand):
    help = "Drive realistic simulated agent runs against a running safestop server."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
        parser.add_argument("--runs", type=int, default=6, help="concurrent runs (worker threads)")
        parser.add_argument(
            "--duration", type=float, default=0, help="seconds to run; 0 = until stopped"
        )
        parser.add_argument("--receiver-port", type=int, default=DEFAULT_PORT)
        parser.add_argument(
            "--pace", type=float, default=1.0, help="multiplies simulated durations"
        )
        parser.add_argument(
            "--reviewer-interval",
            type=float,
            default=8.0,
            help="mean seconds between reviewer-bot stops/takeovers; 0 = none",
        )
        parser.add_argument(
            "--approval-workers",
            type=int,
            default=3,
            help="extra workers running payment/deploy/customer-email runs that need approval",
        )
        parser.add_argument(
            "--approval-grace",
            type=float,
            default=45.0,
            help="seconds an approval waits for a person before the approver bot decides; "
            "0 = the bot never decides",
        )
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument(
            "--language",
            choices=LANGUAGES,
            default=(os.environ.get("SAFESTOP_DEMO_LANGUAGE") or "en").lower(),
            help="the language the agents write titles, steps and summaries in "
            "(default: SAFESTOP_DEMO_LANGUAGE, else en)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("safestop.simulator").setLevel(logging.INFO)
        logging.getLogger("httpx").setLevel(
            logging.WARNING
        )  # one line per request drowns the story
        delay = float(os.environ.get("SAFESTOP_SIMULATOR_STARTUP_DELAY", "0") or 0)
        if delay > 0:
            time.sleep(delay)

        stamp = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
        teams = [
            TeamCredentials(
                slug,
                self._token(slug, f"simulator-{stamp}", "agent"),
                self._token(slug, f"simulator-reviewer-{stamp}", "reviewer"),
            )
            for slug, _ in DEMO_TEAMS
        ]
        connections.close_all()  # from here on the simulator is only an HTTP client

        receiver = WebhookReceiver(port=options["receiver_port"]).start()
        if receiver.host not in settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS:
            self.stdout.write(
                self.style.WARNING(
                    f"Webhook receiver on {receiver.host}: if the server does not list it in "
                    "SAFESTOP_WEBHOOK_ALLOWED_HOSTS, simulated webhooks are refused (the runs go on)."
                )
            )
        simulator = Simulator(
            SimulatorConfig(
                url=options["url"],
                teams=teams,
                receiver_url=receiver.url(""),
                concurrency=max(1, options["runs"]),
                pace=max(0.05, options["pace"]),
                reviewer_interval=options["reviewer_interval"],
                seed=options["seed"],
                approval_workers=max(0, options["approval_workers"]),
                approval_grace=options["approval_grace"],
                language=options["language"],
            )
        )
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: simulator.request_stop())
        try:
            if not simulator.wait_until_ready():
                return
            simulator.start()
            self.stdout.write(
                f"Simulator: {options['runs']} concurrent runs against {options['url']}, "
                f"webhooks to {receiver.url('/hooks/')}, tokens simulator-{stamp}."
            )
            simulator.run_for(options["duration"] or None)
        finally:
            simulator.stop()
            receiver.close()
        summary = ", ".join(f"{key}={count}" for key, count in sorted(simulator.outcomes.items()))
        self.stdout.write(
            f"Simulator stopped: {len(simulator.run_ids)} runs ({summary or 'none finished'}); "
            f"{receiver.count()} webhook(s) received."
        )

    @staticmethod
    def _token(team: str, name: str, role: str) -> str:
        _token, raw = api_token_create(team_slug=team, name=name, role=role)
        return raw
