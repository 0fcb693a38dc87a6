"""The simulator's side of the demo tests: the demo teams' tokens, and where its runs are."""

from __future__ import annotations

import time

from console.demo.simulator import TeamCredentials
from runs.models import Run, RunStatus
from runs.tokens import api_token_create

# A run in one of these states still has a worker that must drain before the test ends.
LIVE = (RunStatus.RUNNING, RunStatus.CANCEL_REQUESTED, RunStatus.DRAINING)


def team_credentials() -> list[TeamCredentials]:
    """An agent and a reviewer token of each demo team (`demo_setup` made the teams)."""
    stamp = str(time.monotonic_ns())
    return [
        TeamCredentials(
            slug,
            api_token_create(team_slug=slug, name=f"sim-{stamp}", role="agent")[1],
            api_token_create(team_slug=slug, name=f"sim-rev-{stamp}", role="reviewer")[1],
        )
        for slug in ("payments", "platform")
    ]


def run_statuses(run_ids: list[str]) -> dict[str, str]:
    return dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "status"))
