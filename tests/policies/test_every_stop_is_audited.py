"""Nothing in policies bypasses the stop service: every policy stop, whatever fact caused it,
has its StopRequest and its one ledger entry, and every StopRequest a policy made has its hit."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

import policies
from policies.models import PolicyHit
from policies.periodic import policies_tick
from runs import services
from runs.errors import RunNotRunning
from runs.models import ExecutionState, LedgerEntry, Run, StopRequest
from tests.support.policies import batch, permit, policy, result
from tests.support.scenarios import AGENT, make_running

pytestmark = pytest.mark.django_db


def _stop_every_way(team) -> None:
    policy(team, "loop", "call.repeats >= 3")
    policy(team, "streak", "run.tool_failures_in_a_row >= 2")
    policy(team, "spend", "run.cost_usd > 2.0", action="stop_and_take_over")
    policy(team, "burst", 'event.type == "outbox.enqueue" && run.side_effects_last_minute > 1')
    policy(team, "slow", "run.elapsed_seconds > 600.0")
    looping, _ = make_running(team)
    for n in range(3):
        try:
            permit(looping, f"c{n}")
        except RunNotRunning:
            pass
    failing, _ = make_running(team)
    for n in range(2):
        permit(failing, f"f{n}", arguments={"n": n})
    for n in range(2):
        result(failing, f"f{n}", ExecutionState.FAILED)
    spending, _ = make_running(team)
    batch(
        spending,
        {
            "event_id": "u",
            "type": "usage",
            "model": "m",
            "input_tokens": 1,
            "output_tokens": 1,
            "cost_usd": 3,
        },
    )
    bursting, _ = make_running(team)
    for n in range(2):
        try:
            services.outbox_enqueue(
                run_id=bursting.pk,
                epoch=1,
                transport="email",
                destination="ops@example.com",
                payload={"subject": "s", "body": str(n)},
                idempotency_key=f"k{n}",
                actor=AGENT,
            )
        except RunNotRunning:
            pass
    slow, _ = make_running(team)
    Run.objects.filter(pk=slow.pk).update(started_at=timezone.now() - timedelta(hours=1))
    policies_tick()


def test_every_policy_stop_has_its_stop_request_and_ledger_entry(team):
    _stop_every_way(team)
    stops = StopRequest.objects.filter(reason="policy_violation")
    assert sorted(stops.values_list("requested_by", flat=True)) == [
        "policy:burst",
        "policy:loop",
        "policy:slow",
        "policy:spend",
        "policy:streak",
    ]
    for stop in stops:
        entries = LedgerEntry.objects.filter(run=stop.run, action="run.stop_requested")
        assert [(e.payload["stop_request_id"], e.actor) for e in entries] == [
            (stop.pk, stop.requested_by)
        ]
        [hit] = PolicyHit.objects.filter(stop_request=stop)
        assert f"policy:{hit.policy_name}" == stop.requested_by
    acted = PolicyHit.objects.filter(action__in=("stop", "stop_and_take_over"))
    assert acted.count() == stops.count()
    assert not acted.filter(stop_request__isnull=True).exists()


def test_the_policies_package_writes_no_run_state_itself():
    """Only runs services move a run: no `status`/`stop_*` assignment, no Run update, in
    policies' own code."""
    offenders = []
    for path in Path(policies.__file__).parent.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr in (
                        "status",
                        "stop_epoch",
                        "stop_reason",
                    ):
                        offenders.append(f"{path.name}:{node.lineno}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "objects"
                and isinstance(node.value, ast.Name)
                and node.value.id in ("Run", "StopRequest")
            ):
                parent_calls = path.read_text().splitlines()[node.lineno - 1]
                if ".update(" in parent_calls or ".create(" in parent_calls:
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
