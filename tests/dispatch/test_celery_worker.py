"""A real Celery worker (and beat) on Redis, in their own processes, on the test database."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery

from console.celery import SAFETY_NET_MIN_SECONDS, beat_schedule
from console.celery import app as safestop_app
from runs import frozen as frozen_rule
from runs import services
from runs.actors import Actor
from runs.ledger_checks import verification_request
from runs.models import LedgerEntry, LedgerVerification, OutboxItem, OutboxStatus, RunStatus
from tests.support.children import ROOT, child_env
from tests.support.isolation import suite_redis_url
from tests.support.scenarios import make_running, reload, stopped_cleanly

# The session's own Redis database (tests/support/isolation.py), and a queue (and worker name)
# unique to this test, so test sessions sharing the Redis server never consume each other's tasks.
REDIS_URL = suite_redis_url()
AGENT = Actor.system("agent")


def _wait(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


class CeleryProcess:
    def __init__(
        self, args: list[str], *, env: dict[str, str], log: Path, ready_marker: str
    ) -> None:
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "console", *args],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if not _wait(
            lambda: ready_marker in self.log() or self.proc.poll() is not None, timeout=60
        ):
            raise AssertionError(f"celery {args[0]} did not start: {self.log()[-3000:]}")
        assert self.proc.poll() is None, self.log()[-3000:]

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture
def queue_name() -> str:
    return f"safestop-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redis_db(queue_name: str) -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # fails loudly: the suite never skips because a service is missing
    try:
        yield REDIS_URL
    finally:
        ours = list(client.scan_iter(match=f"*{queue_name}*"))  # the queue and kombu's bindings
        if ours:
            client.delete(*ours)
        client.close()


@pytest.fixture
def celery_env(receiver, redis_db, queue_name) -> dict[str, str]:
    return child_env(
        REDIS_URL=redis_db,
        SAFESTOP_CELERY_QUEUE=queue_name,
        SAFESTOP_WEBHOOK_ALLOWED_HOSTS=receiver.host,
        SAFESTOP_BACKGROUND_INTERVAL="0.5",
        SAFESTOP_LOG_LEVEL="INFO",
    )


@pytest.fixture
def worker(celery_env, queue_name, tmp_path) -> Iterator[CeleryProcess]:
    process = CeleryProcess(
        [
            "worker",
            "--pool=solo",
            "--loglevel=INFO",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            f"--hostname={queue_name}@%h",
        ],
        env=celery_env,
        log=tmp_path / "worker.log",
        ready_marker="ready.",
    )
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def client_app(redis_db, queue_name) -> Iterator[Celery]:
    """A plain Celery client on the same broker and queue: it only knows task *names*."""
    client = Celery("test-client", broker=redis_db)
    client.conf.task_default_queue = queue_name
    try:
        yield client
    finally:
        client.close()


def _enqueue(run, receiver, key: str, payload: dict) -> OutboxItem:
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=run.stop_epoch,
        transport="webhook",
        destination=receiver.url("/hook"),
        payload=payload,
        idempotency_key=key,
        actor=AGENT,
    )
    return item


def _status(item: OutboxItem) -> str:
    return OutboxItem.objects.values_list("status", flat=True).get(pk=item.pk)


def _seen(item: OutboxItem) -> str:
    """The status every reader sees (an item the stop's epoch froze is frozen before relabel)."""
    current = OutboxItem.objects.get(pk=item.pk)
    return frozen_rule.present(reload(item.run), [current])[0].status


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_dispatches_to_the_webhook_and_refuses_frozen_items(
    team, receiver, worker, client_app
) -> None:
    live, _lease = make_running(team)
    stopped, _lease2 = make_running(team)
    first = _enqueue(live, receiver, "pay-1", {"amount": 12, "to": "acct-9"})
    frozen = _enqueue(stopped, receiver, "frozen-1", {"amount": 99})
    services.run_stop(run_id=stopped.pk, reason="user_stop", actor=Actor.system("reviewer"))
    assert _seen(frozen) == OutboxStatus.FROZEN

    client_app.send_task("runs.tasks.dispatch_outbox_item", args=[first.pk])
    assert receiver.wait_for(1, timeout=30), worker.log()[-3000:]
    assert _wait(lambda: _status(first) == OutboxStatus.SENT), worker.log()[-3000:]

    [receipt] = receiver.receipts
    assert receipt.body == {"amount": 12, "to": "acct-9"}
    assert receipt.idempotency_key == "pay-1"
    first.refresh_from_db()
    assert f":{worker.proc.pid}:" in first.claimed_by  # the worker process did it, not us
    assert first.response_status == 200

    # The solo worker runs tasks in order: the frozen item's task and a redelivery of the first
    # are both done by the time the last one's item is sent.
    last = _enqueue(live, receiver, "pay-2", {"amount": 1})
    for item_id in (frozen.pk, first.pk, last.pk):
        client_app.send_task("runs.tasks.dispatch_outbox_item", args=[item_id])
    assert _wait(lambda: _status(last) == OutboxStatus.SENT), worker.log()[-3000:]
    assert receiver.keys() == ["pay-1", "pay-2"]
    assert _seen(frozen) == OutboxStatus.FROZEN
    # The relabel task writes the row as every reader already saw it.
    client_app.send_task("runs.tasks.relabel_frozen_outbox", kwargs={"run_id": stopped.pk})
    assert _wait(lambda: _status(frozen) == OutboxStatus.FROZEN), worker.log()[-3000:]
    assert "Traceback" not in worker.log()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_wake_scheduled_at_the_lease_expiry_reaps_it_with_no_fast_beat(
    team, receiver, worker, client_app
) -> None:
    """Idle costs nothing: no beat ticks here at all. A change asks for a wake, the worker
    schedules one at the next deadline (the lease's expiry) and that wake interrupts the run."""
    run, _lease = make_running(team)
    doomed, _ = make_running(team, ttl=1)
    item = _enqueue(run, receiver, "wake-1", {"hello": "wake"})

    client_app.send_task("runs.tasks.schedule_wake")
    client_app.send_task("runs.tasks.dispatch_pending")

    assert _wait(lambda: _status(item) == OutboxStatus.SENT, timeout=30), worker.log()[-3000:]
    assert _wait(lambda: reload(doomed).status == RunStatus.INTERRUPTED, timeout=30), worker.log()[
        -3000:
    ]
    assert reload(doomed).interruption["reason"] == "lease_expired"
    assert receiver.keys() == ["wake-1"]
    log = worker.log()
    assert "runs.tasks.schedule_wake" in log and "runs.tasks.wake" in log, log[-3000:]
    assert "Traceback" not in log


def test_the_beat_schedule_names_only_registered_tasks() -> None:
    import notifications.tasks  # noqa: F401  (registers the tasks)
    import runs.tasks  # noqa: F401

    schedule = beat_schedule(0.5)
    assert {entry["task"] for entry in schedule.values()} <= set(safestop_app.tasks)
    # The safety net: one sweep of everything (`wake`) and the dispatcher, never faster than
    # SAFETY_NET_MIN_SECONDS whatever it is asked for.
    assert {"runs.tasks.wake", "runs.tasks.dispatch_pending"} <= {
        e["task"] for e in schedule.values()
    }
    assert min(float(e["schedule"]) for e in schedule.values()) >= SAFETY_NET_MIN_SECONDS
    for name in (
        "runs.tasks.dispatch_outbox_item",
        "runs.tasks.schedule_wake",
        "runs.tasks.relabel_frozen_outbox",
        *(entry["task"] for entry in schedule.values()),
    ):
        assert safestop_app.tasks[name].acks_late is True


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_runs_the_ledger_walk_someone_asked_for(team, worker, client_app) -> None:
    stopped_cleanly(team)
    verification, _created = verification_request(requested_by="alice")
    client_app.send_task("notifications.tasks.verify_ledger", args=[verification.pk])

    def finished() -> bool:
        return LedgerVerification.objects.get(pk=verification.pk).finished_at is not None

    assert _wait(finished, timeout=30), worker.log()[-3000:]
    done = LedgerVerification.objects.get(pk=verification.pk)
    assert done.checked == LedgerEntry.objects.count() and done.broken_entry_id is None
    assert done.error == "" and "Traceback" not in worker.log()
