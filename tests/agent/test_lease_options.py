"""`client.lease(...)` takes the intervals docs/agents.md describes."""

from __future__ import annotations

import threading

import pytest
from agent_fakes import ApprovalServer, FakeApi

from safestop_agent import SafestopClient

pytestmark = pytest.mark.timeout(30)


def test_lease_takes_the_heartbeat_and_approval_poll_intervals(
    client: SafestopClient, fake_api: FakeApi
) -> None:
    server = ApprovalServer(fake_api, {"deploy"})
    with client.lease(
        "run_1", "worker-1", push=False, heartbeat_interval=0.05, approval_poll_interval=0.05
    ) as run:
        assert (run.heartbeat_interval, run.approval_poll_interval) == (0.05, 0.05)
        # No push: only polling the approval at that interval finds the decision.
        threading.Timer(0.2, lambda: server.decide("approved", arguments={"env": "prod"})).start()
        with run.tool_call("deploy", {"env": "prod"}, "write") as call:
            call.result = "deployed"
    polls = [path for _m, path, _b in fake_api.requests if path.endswith("approvals/appr_1/")]
    assert len(polls) >= 2, "polled until decided"
    assert call.arguments == {"env": "prod"}
