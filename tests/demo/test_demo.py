"""The living demo: `demo_setup` accounts, and the simulator against a live server."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from console.demo.accounts import DEMO_USERS
from console.demo.receiver import pick_port
from console.demo.simulator import SCENARIOS, Simulator, SimulatorConfig
from runs.ledger import ledger_verify
from runs.models import (
    ApiToken,
    Membership,
    OutboxItem,
    OutboxStatus,
    Role,
    Run,
    RunStatus,
    StopRequest,
    Team,
)
from runs.selectors import side_effect_leakage
from tests.support.demo import LIVE, run_statuses, team_credentials
from tests.support.stack import Stack, stack_start, wait_until

ROOT = Path(__file__).resolve().parents[2]
User = get_user_model()


@pytest.mark.django_db
def test_demo_setup_is_idempotent_and_creates_the_three_roles():
    names = [user.username for user in DEMO_USERS]
    assert not User.objects.filter(username__in=names).exists()  # no migration creates them
    first = io.StringIO()
    call_command("demo_setup", stdout=first)
    hashes = dict(User.objects.filter(username__in=names).values_list("username", "password"))
    second = io.StringIO()
    call_command("demo_setup", stdout=second)

    assert User.objects.filter(username__in=names).count() == 3
    assert (
        dict(User.objects.filter(username__in=names).values_list("username", "password")) == hashes
    )
    assert set(Team.objects.values_list("slug", flat=True)) >= {"payments", "platform"}
    roles = {
        (m.user.username, m.team.slug): m.role
        for m in Membership.objects.select_related("user", "team")
    }
    for team in ("payments", "platform"):
        assert (roles[("admin", team)], roles[("reviewer", team)], roles[("viewer", team)]) == (
            Role.ADMIN,
            Role.REVIEWER,
            Role.VIEWER,
        )
    assert Membership.objects.count() == 6
    admin = User.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff
    assert not User.objects.get(username="viewer").is_staff
    for user in DEMO_USERS:
        assert User.objects.get(username=user.username).check_password(user.password)
        assert f"{user.username:<10} {user.password}" in first.getvalue()
    assert "3 user(s) created" in first.getvalue() and "0 user(s) created" in second.getvalue()


@pytest.mark.django_db(transaction=True)
def test_simulator_drives_runs_to_several_states_and_sends_webhooks(stack, receiver):
    simulator = Simulator(
        SimulatorConfig(
            url=stack.url,
            teams=team_credentials(),
            receiver_url=receiver.url(""),
            concurrency=len(SCENARIOS),
            pace=0.25,
            reviewer_interval=0.8,
            bot_share=1.0,
            seed=7,
        )
    )
    assert simulator.wait_until_ready(10)
    started = time.monotonic()
    simulator.start()
    try:
        # busy within seconds: every worker has a run going
        wait_until(
            lambda: sum(s in LIVE for s in run_statuses(simulator.run_ids).values()) >= 4,
            timeout=5,
            what="four live runs",
        )
        busy_after = time.monotonic() - started
        simulator.run_for(9)
    finally:
        simulator.stop(timeout=15)
    statuses = run_statuses(simulator.run_ids)
    print(
        f"\nbusy after {busy_after:.1f}s; {len(statuses)} runs; outcomes {dict(simulator.outcomes)}"
    )

    assert simulator.errors == 0, dict(simulator.outcomes)
    assert len(statuses) >= len(SCENARIOS)
    kinds = {key.split(":")[0] for key in simulator.outcomes}
    assert kinds >= {"research", "notify", "deploy", "crash", "budget", "steering"}
    reached = set(statuses.values())
    assert {RunStatus.COMPLETED} <= reached
    assert (
        len(
            reached
            & {
                RunStatus.COMPLETED,
                RunStatus.STOPPED_CLEANLY,
                RunStatus.STOPPED_DIRTY,
                RunStatus.HANDED_OFF,
                RunStatus.INTERRUPTED,
            }
        )
        >= 3
    ), reached
    assert (
        Run.objects.filter(pk__in=simulator.run_ids, stop_reason="budget_exhausted").exists()
        or Run.objects.filter(pk__in=simulator.run_ids, stop_reason="timeout").exists()
    )
    # webhooks went out through the server's dispatcher, each once
    assert receiver.count() > 0 and receiver.duplicates() == {}
    sent = OutboxItem.objects.filter(run_id__in=simulator.run_ids, status=OutboxStatus.SENT)
    assert sent.exists()
    dispatched = {r.run_id for r in receiver.receipts if r.run_id}
    assert dispatched and dispatched <= set(simulator.run_ids)
    # after stop(): nothing of the simulator is left running
    wait_until(
        lambda: not [s for s in run_statuses(simulator.run_ids).values() if s in LIVE],
        timeout=10,
        what="the simulator's runs to settle",
    )
    assert all(ledger_verify(run_id=run_id)[1] is None for run_id in simulator.run_ids)
    # across the whole busy session, nothing started after a stop (DESIGN §7: must be 0)
    now = timezone.now()
    assert side_effect_leakage(since=now - timedelta(hours=1), until=now)["total"] == 0
    assert StopRequest.objects.filter(run_id__in=simulator.run_ids).count() >= 3


def _database_url() -> str:
    s = connection.settings_dict
    return f"postgres://{quote(s['USER'] or '', safe='')}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


@pytest.fixture
def stack_for_command(transactional_db: None, django_db_blocker: Any, receiver: Any):
    """A live server that also allows the port the `simulate` command's receiver will use."""
    port = pick_port(0)
    for stack in stack_start(
        django_db_blocker,
        receiver,
        "",
        "",
        SAFESTOP_WEBHOOK_ALLOWED_HOSTS=[receiver.host, f"127.0.0.1:{port}"],
    ):
        yield stack, port


def test_simulate_command_runs_and_ends_cleanly_on_sigterm(stack_for_command, own_tree):
    stack, port = stack_for_command
    assert isinstance(stack, Stack)
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "SAFESTOP_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "simulate",
            "--url",
            stack.url,
            "--runs",
            "5",
            "--pace",
            "0.25",
            "--receiver-port",
            str(port),
            "--reviewer-interval",
            "1",
            "--seed",
            "3",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: Run.objects.filter(created_by__startswith="simulator-").count() >= 5,
            timeout=20,
            what="the simulator's first runs",
        )
        time.sleep(5)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, output[-3000:]
    assert "Simulator stopped:" in output and "webhook(s) received" in output
    tokens = ApiToken.objects.filter(name__startswith="simulator-")
    assert {token.team.slug for token in tokens} == {"payments", "platform"}
    assert {token.role for token in tokens} == {"agent", "reviewer"}
    runs = Run.objects.filter(created_by__startswith="simulator-")
    assert len(set(runs.values_list("status", flat=True))) >= 2
    # SIGTERM stopped the live runs through the API: they settle instead of hanging
    wait_until(lambda: not runs.filter(status__in=LIVE).exists(), timeout=10, what="runs to settle")
    # and no shell-tool supervisor outlived the simulator (they die with their parent): one that
    # did was re-parented to this process (own_tree), so only our own tree is looked at
    wait_until(
        lambda: not [pid for pid in own_tree() if _is_reaper(pid)],
        timeout=5,
        what="shell-tool supervisors to exit",
    )


def _is_reaper(pid: int) -> bool:
    try:
        return b"_reaper.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
