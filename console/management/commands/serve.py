"""`python manage.py serve`: the whole embedded console as one command (DESIGN §8).

1. apply migrations;
2. unless --no-demo: create the demo users and teams (printing their passwords);
3. start the background loop (dispatcher, reapers, drain watchdog, budget enforcer) inside
   this process — the in-memory channel layer only reaches consumers in this process — and a
   first walk of the ledger beside it, unless REDIS_URL is set, in which case Celery workers
   and beat do that work;
4. unless --no-demo: start the simulator, which drives agent runs over real HTTP/websockets;
5. run daphne (HTTP + websockets) in the foreground until Ctrl-C.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from accounts.services import group_roles_seed


def public_url(host: str, port: int) -> str:
    """The console's address for links sent out (notifications, Slack): SAFESTOP_PUBLIC_URL if
    the environment sets it, else the address this server listens on (a wildcard host is not an
    address a person can open: the loopback one stands in for it)."""
    configured = os.environ.get("SAFESTOP_PUBLIC_URL", "").strip()
    if configured:
        return configured.rstrip("/")
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


class Command(BaseCommand):
    help = (
        "Run the embedded safestop console: migrations, daphne, the background loop and the demo."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--no-demo", action="store_true", help="no demo users, no simulated runs"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        host, port, demo = options["host"], options["port"], not options["no_demo"]
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("Database migrated.")
        # SAFESTOP_OIDC_GROUP_ROLES seeds the admins' group → team-role table (DESIGN §16).
        seeded = group_roles_seed()
        if seeded.created or seeded.updated or seeded.removed:
            self.stdout.write(
                f"IdP group roles: {len(seeded.created)} added, {len(seeded.updated)} changed, "
                f"{len(seeded.removed)} removed."
            )
        if demo:
            call_command("demo_setup")

        # Importing daphne.server installs Twisted's asyncio reactor on a fresh loop: that loop
        # is the one our consumers and the in-memory channel layer live on.
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server, twisted_loop

        from console import realtime
        from console.asgi import application

        realtime.bind_event_loop(twisted_loop)
        background = None
        if not settings.REDIS_URL:
            from runs.background import start_background_thread

            background = start_background_thread()
            self.stdout.write(
                "Background loop started (dispatcher, reapers, drain watchdog, budget enforcer)."
            )
            # A first walk of the ledger now, beside the loop, so the audit page has a recorded
            # one from the start; then every SAFESTOP_LEDGER_VERIFY_SECONDS.
            from notifications.periodic import walk_ledger_aside

            walk_ledger_aside()
        else:
            self.stdout.write(
                "REDIS_URL is set: background work is expected from Celery workers and beat."
            )

        base_url = f"http://{host}:{port}"
        # Links in notifications point at this server unless SAFESTOP_PUBLIC_URL says otherwise.
        settings.SAFESTOP_PUBLIC_URL = public_url(host, port)
        simulator = self._start_simulator(base_url) if demo else None
        if simulator is not None:
            # Ctrl-C: stop the simulator while daphne still serves, so its workers can drain
            # their runs through the API instead of being left to the lease reaper.
            from twisted.internet import reactor, threads

            # (twisted's stub of the installed reactor is IReactorCore's, whose callable is variadic)
            trigger = reactor.addSystemEventTrigger
            trigger("before", "shutdown", threads.deferToThread, _stop_process, simulator)  # type: ignore[arg-type]
        self.stdout.write(
            self.style.SUCCESS(f"safestop console on {base_url}/  (API docs: {base_url}/api/docs/)")
        )
        try:
            Server(
                application=application,
                endpoints=build_endpoint_description_strings(host=host, port=port),
                signal_handlers=True,
                websocket_timeout=86400,
            ).run()
        finally:
            if simulator is not None:
                _stop_process(simulator)
            if background is not None:
                background.stop()

    def _start_simulator(self, base_url: str) -> subprocess.Popen[bytes]:
        """The simulator is a separate process: an agent runtime is a client, not a part of us."""
        from console.demo.receiver import pick_port

        # The simulator's webhook receiver must be on this server's allow-list (read at import):
        # pick its port here, allow it, and hand the port over.
        receiver_port = pick_port()
        receiver_host = f"127.0.0.1:{receiver_port}"
        if receiver_host not in settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS:
            settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS.append(receiver_host)
        env = {
            **os.environ,
            "SAFESTOP_SIMULATOR_STARTUP_DELAY": "1.5",
            "SAFESTOP_WEBHOOK_ALLOWED_HOSTS": ",".join(settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS),
        }
        process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "simulate",
                "--url",
                base_url,
                "--receiver-port",
                str(receiver_port),
            ],
            cwd=str(settings.BASE_DIR),
            env=env,
        )
        self.stdout.write(f"Simulator started (pid {process.pid}).")
        return process


def _stop_process(process: subprocess.Popen[bytes], grace_seconds: float = 8.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
