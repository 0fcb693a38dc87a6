"""The demo's policies (DESIGN §14): demo_setup makes two enforcing policies and one in observe
mode, and the simulator's looping and flaky agents trip the enforcing ones within the first
minute, each stop a policy stop with its StopRequest."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from console.demo.accounts import DEMO_POLICIES, demo_accounts_ensure
from console.demo.simulator import SCENARIOS, Simulator, SimulatorConfig
from policies.models import Policy, PolicyHit
from runs.models import StopRequest
from tests.support.demo import team_credentials
from tests.support.stack import wait_until

# A simulated minute at this pace is 30 s: the policies trip in its first seconds, the rest is
# room for a loaded machine.
PACE = 0.5
FIRST_MINUTE = 60 * PACE


@pytest.mark.django_db
def test_demo_setup_creates_the_policies_once():
    output = io.StringIO()
    call_command("demo_setup", stdout=output)
    call_command("demo_setup", stdout=io.StringIO())
    assert "Demo policies (3 created" in output.getvalue()
    modes = sorted(Policy.objects.values_list("name", "mode"))
    assert modes == [
        ("demo-failure-streak", "enforce"),
        ("demo-long-runs", "observe"),
        ("demo-loop", "enforce"),
    ]
    assert len(DEMO_POLICIES) == 3


def test_the_simulated_agents_trip_the_enforcing_policies_in_the_first_minute(stack, receiver):
    demo_accounts_ensure()
    simulator = Simulator(
        SimulatorConfig(
            url=stack.url,
            teams=team_credentials(),
            receiver_url=receiver.url(""),
            concurrency=len(SCENARIOS),
            pace=PACE,
            reviewer_interval=0,
            approval_workers=0,
            seed=5,
        )
    )
    assert simulator.wait_until_ready(10)
    simulator.start()
    wanted = {"policy:demo-loop", "policy:demo-failure-streak"}
    try:
        wait_until(
            lambda: (
                wanted
                <= set(
                    StopRequest.objects.filter(reason="policy_violation").values_list(
                        "requested_by", flat=True
                    )
                )
            ),
            timeout=FIRST_MINUTE,
            what="a stop by each enforcing demo policy",
        )
    finally:
        simulator.stop(timeout=15)
    for stop in StopRequest.objects.filter(reason="policy_violation"):
        assert PolicyHit.objects.filter(stop_request=stop).count() == 1
        assert stop.run.agent.startswith(("looping-", "ledger-sync-"))
