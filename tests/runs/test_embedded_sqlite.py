"""`make run`'s embedded stack: SQLite, no Redis, the background thread, the simulator.

The suite itself runs on PostgreSQL, so anything vendor-specific on a hot path (a data-modifying
CTE, a trigram index, `FOR UPDATE`) would pass every other test and still break the first thing
a new user sees. Here the simulated agents and the reviewer bot work against a real server on a
SQLite file, and the stops they make must settle.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_http(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer in time")


def _settled_stops(database: Path) -> int:
    """Runs that a stop took all the way to a stopped state (read-only, beside the server)."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM runs_stoprequest s JOIN runs_run r ON r.id = s.run_id "
            "WHERE r.status IN ('stopped_cleanly', 'stopped_dirty', 'handed_off')"
        ).fetchone()
    return int(count)


def _embedded_env(database: Path, receiver_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        SAFESTOP_SQLITE_PATH=str(database),
        SAFESTOP_WEBHOOK_ALLOWED_HOSTS=f"127.0.0.1:{receiver_port}",
        PYTHONUNBUFFERED="1",
    )
    return env


def test_simulated_agents_are_stopped_and_settle_on_the_embedded_sqlite(tmp_path):
    database = tmp_path / "embedded.sqlite3"
    port, receiver_port = _free_port(), _free_port()
    env = _embedded_env(database, receiver_port)
    server = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--no-demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    simulator = None
    try:
        _wait_for_http(f"http://127.0.0.1:{port}/api/schema/", time.monotonic() + 90)
        subprocess.run(
            [sys.executable, "manage.py", "demo_setup"], cwd=ROOT, env=env, check=True, timeout=120
        )
        simulator = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "simulate",
                "--url",
                f"http://127.0.0.1:{port}",
                "--runs",
                "4",
                "--pace",
                "0.25",
                "--receiver-port",
                str(receiver_port),
                "--reviewer-interval",
                "1",
                "--seed",
                "5",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and _settled_stops(database) < 2:
            assert server.poll() is None, "the server died"
            time.sleep(1)
        settled = _settled_stops(database)
    finally:
        outputs = []
        for process in (simulator, server):
            if process is None:
                continue
            process.terminate()
            try:
                outputs.append(process.communicate(timeout=40)[0])
            except subprocess.TimeoutExpired:
                process.kill()
                outputs.append(process.communicate()[0])
    log = "\n".join(outputs)
    assert settled >= 2, log[-4000:]
    assert "Traceback" not in log, log[-6000:]
