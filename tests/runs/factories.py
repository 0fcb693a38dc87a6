"""Small builders for runs in a given state, through the services (never by writing models)."""

from __future__ import annotations

from runs import services
from runs.actors import Actor
from runs.models import Lease, Run, Team

SYSTEM = Actor.system("test")


def make_run(
    team: Team, *, steps: tuple[str, ...] = ("plan", "act", "notify"), **budget: int
) -> Run:
    return services.run_create(
        team=team,
        title="Quarterly report",
        agent="report-bot",
        actor=SYSTEM,
        steps=[services.PlannedStep(key) for key in steps],
        **budget,
    )


def make_running(team: Team, *, ttl: float = 30, **budget: int) -> tuple[Run, Lease]:
    run = make_run(team, **budget)
    lease = services.lease_acquire(
        run_id=run.pk, worker_id="worker-1", ttl_seconds=ttl, actor=SYSTEM
    )
    run.refresh_from_db()
    return run, lease


def reload(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)
