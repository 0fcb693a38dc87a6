"""The management commands of DESIGN §5 and §8, run as a person would run them."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from runs.models import ApiToken, Team
from runs.tokens import api_token_authenticate, hash_token
from tests.support.stack import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_create_api_token_creates_the_team_and_prints_the_raw_token_last_once():
    out, err = StringIO(), StringIO()
    call_command(
        "create_api_token",
        "--team",
        "newteam",
        "--name",
        "ci-bot",
        "--role",
        "reviewer",
        stdout=out,
        stderr=err,
    )
    raw = out.getvalue().strip().splitlines()[-1]
    token = ApiToken.objects.get(name="ci-bot")
    assert Team.objects.filter(slug="newteam").exists()
    assert token.role == "reviewer"
    assert (
        token.token_hash == hash_token(raw) and raw not in token.token_hash
    )  # only the hash is stored
    assert api_token_authenticate(raw) == token
    with pytest.raises(CommandError, match="already has a token"):
        call_command(
            "create_api_token",
            "--team",
            "newteam",
            "--name",
            "ci-bot",
            stdout=StringIO(),
            stderr=StringIO(),
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer in time")


@pytest.mark.slow
def _finished_walks(path) -> int:
    with sqlite3.connect(path, timeout=5) as db:
        return db.execute(
            "SELECT count(*) FROM runs_ledgerverification "
            "WHERE requested_by = 'scheduled' AND finished_at IS NOT NULL AND error = ''"
        ).fetchone()[0]


def test_serve_migrates_and_serves_http_and_websockets_on_sqlite(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["SAFESTOP_SQLITE_PATH"] = str(tmp_path / "serve.sqlite3")
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--no-demo", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert _wait_for(f"http://127.0.0.1:{port}/api/schema/", time.monotonic() + 60) == 200
        # A websocket upgrade reaches the ASGI router (agents authenticate by token: none here → refused).
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                f"GET /ws/agent/runs/run_nope/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            head = sock.recv(200).decode(errors="replace")
        assert head.startswith("HTTP/1.1 ")
        assert (tmp_path / "serve.sqlite3").exists()
        # The embedded server walks the ledger once at start, beside its loop (the audit page
        # has a recorded walk to show from the start).
        wait_until(
            lambda: _finished_walks(tmp_path / "serve.sqlite3") >= 1,
            timeout=20,
            what="the first ledger walk",
        )
    finally:
        process.terminate()
        output = process.communicate(timeout=20)[0].decode(errors="replace")
    assert "Database migrated." in output
    assert "Background loop started" in output
