"""`/metrics` counts policy hits by policy and mode, and evaluation errors."""

from __future__ import annotations

import pytest

from runs.errors import RunNotRunning
from tests.support.metrics import URL, parse, value
from tests.support.policies import permit, policy
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db


def test_hits_by_policy_and_mode_and_errors(client, team, reviewer_token):
    policy(team, "loop-watch", "call.repeats >= 2", mode="observe")
    policy(team, "loop", "call.repeats >= 3")
    policy(team, "broken", "call.arguments.amount > 1", on_error="ignore")
    for _ in range(2):
        run, _lease = make_running(team)
        permit(run, "c1")
        permit(run, "c2")
        with pytest.raises(RunNotRunning):
            permit(run, "c3")
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    hits = "safestop_policy_hits_total"
    assert value(samples, hits, team="acme", policy="loop-watch", mode="observe") == 2
    assert value(samples, hits, team="acme", policy="loop", mode="enforce") == 2
    assert value(samples, "safestop_policy_errors_total", team="acme", policy="broken") == 6
