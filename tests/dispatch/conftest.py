"""Fixtures for the side-effect gateway: a live webhook receiver, and real OS processes
(dispatchers, a Celery worker) that share the pytest test database."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.children import ROOT, child_env
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


class DispatcherProcess:
    """`python -m tests.dispatch.dispatcher_proc` in its own process, spoken to line by line."""

    def __init__(self, *, allowed_hosts: str) -> None:
        self.stderr = tempfile.NamedTemporaryFile(prefix="dispatcher-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.dispatch.dispatcher_proc"],
            cwd=ROOT,
            env=child_env(SAFESTOP_WEBHOOK_ALLOWED_HOSTS=allowed_hosts),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self.read(timeout=30)
        assert hello.startswith("hello "), hello
        self.pid = self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("<eof>")

    def read(self, timeout: float = 30) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"dispatcher {self.proc.pid} did not answer in {timeout}s; log: {self.log()}"
            ) from None
        return self._checked(line)

    def poll(self) -> str | None:
        """The next answer if one has arrived, else None (never blocks)."""
        try:
            return self._checked(self.lines.get_nowait())
        except queue.Empty:
            return None

    def _checked(self, line: str) -> str:
        if line.startswith("error") or line == "<eof>":
            raise AssertionError(f"dispatcher {self.proc.pid}: {line}; log: {self.log()}")
        return line

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def ask(self, command: str, timeout: float = 30) -> str:
        self.send(command)
        return self.read(timeout)

    def log(self) -> str:
        return Path(self.stderr.name).read_text()[-3000:]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self.stderr.close()
        os.unlink(self.stderr.name)


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
