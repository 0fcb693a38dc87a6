"""The stack a benchmark runs against, and helpers that need Django (imported after setup)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import PYTHON, ROOT, Managed, start


@dataclass
class Stack:
    base_url: str
    port: int
    env: dict[str, str]
    log_dir: Path
    daphne: Managed
    quick: bool
    team_id: int
    team_slug: str
    agent_token: str
    reviewer_token: str
    staff_username: str
    staff_password: str
    reviewer_username: str
    celery: Managed | None = None
    notes: list[str] = field(default_factory=list)

    def n(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def start_celery(self) -> Managed:
        """A Celery worker with embedded beat: the dispatcher, reapers and watchdog of production."""
        if self.celery is None or self.celery.process.poll() is not None:
            # A schedule file left by an earlier bench would make every safety-net entry
            # (the ledger walk among them) overdue at start.
            for stale in self.log_dir.glob("celerybeat-schedule*"):
                stale.unlink()
            self.celery = start(
                "celery",
                [
                    PYTHON,
                    "-m",
                    "celery",
                    "-A",
                    "console",
                    "worker",
                    "-B",
                    "--pool",
                    "solo",
                    "--loglevel",
                    "WARNING",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "--schedule",
                    str(self.log_dir / "celerybeat-schedule"),
                ],
                self.env,
                self.log_dir,
            )
            time.sleep(2.0)  # let it connect to the broker and fire its first beat
            if self.celery.process.poll() is not None:
                raise RuntimeError(f"celery exited; see {self.celery.log_path}")
        return self.celery

    def stop_celery(self) -> None:
        if self.celery is not None:
            self.celery.stop()
            self.celery = None


class LineProcess:
    """A helper process spoken to in JSON lines (stdin) and answering in JSON lines (stdout)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self._log = open(log_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            argv,
            cwd=str(ROOT),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.strip()
            if line.startswith("{"):
                self._lines.put(json.loads(line))

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def receive(self, timeout: float) -> dict[str, Any]:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer from {self.process.args[1]} within {timeout}s") from None

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.send({"op": "quit"})
                self.process.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(5)
        self._log.close()
