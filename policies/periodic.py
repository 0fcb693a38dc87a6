"""The periodic tick for rules of time (`run.elapsed_seconds`): nothing else changes a run's
values between its facts, so only policies that read the clock are evaluated here."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from django.urls import reverse
from django.utils import timezone

from policies.evaluate import tick_run, time_policies
from policies.models import Policy
from runs.models import Run, RunStatus
from runs.services import locked_run


def policies_tick() -> int:
    """Evaluate time rules on every running run of the teams that have one; returns how many
    runs were looked at."""
    team_ids = set(
        Policy.objects.filter(enabled=True, expression__contains="elapsed_seconds").values_list(
            "team_id", flat=True
        )
    )
    looked = 0
    for team_id in team_ids:
        policies = time_policies(team_id)
        if not policies:
            continue
        _load_the_urls()
        run_ids = Run.objects.filter(team_id=team_id, status=RunStatus.RUNNING).values_list(
            "pk", flat=True
        )
        for run_id in list(run_ids):
            with locked_run(run_id) as run:
                tick_run(run, policies, now=timezone.now())
            looked += 1
    return looked


@functools.cache
def _load_the_urls() -> None:
    """Load the URLconf before the first run lock this process takes for a tick.

    A policy's stop notifies from inside its transaction, and the notice links to the run
    (`notifications.events`): a process's first `reverse` imports every view of the URLconf,
    1.8–3.5 s measured here, all of it under the run lock and before the stop signal. A server
    process has loaded it with its first request; the background processes that run this tick
    (the embedded loop, a Celery worker) have not."""
    reverse("console:audit")


# How often a time rule is looked at while a run it may apply to is running: a rule on a run's
# elapsed time acts within this much of the moment it first holds.
TIME_RULE_PERIOD = timedelta(seconds=1)


def next_time_rule_deadline() -> datetime | None:
    """When the tick is next due (`runs.hooks.on_deadline`): a second from now while a team
    with an enabled time rule has a running run, else never (nothing to look at; a new run or
    a new policy commits a change, which schedules the next wake)."""
    team_ids = Policy.objects.filter(
        enabled=True, expression__contains="elapsed_seconds"
    ).values_list("team_id", flat=True)
    if Run.objects.filter(team_id__in=team_ids, status=RunStatus.RUNNING).exists():
        return timezone.now() + TIME_RULE_PERIOD
    return None
