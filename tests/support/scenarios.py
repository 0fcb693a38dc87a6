"""Runs in realistic states, built only through the services (as an agent and a reviewer would).

`new_run` / `start` / `work` / `running` build a run that has done some work (the console, the
consumers, the browser); `make_run` / `make_running` a bare one, made by the system actor, whose
steps are named by their keys (the services and the API tests); `run_interrupt` loses a running
run's worker. The moves a worker makes through events are in `tests/support/run_factories.py`.
"""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

from django.utils import timezone

from runs import frozen, services
from runs.actors import Actor
from runs.models import Lease, OutboxItem, Run, Team
from tests.support.run_factories import run_complete, run_fail

AGENT = Actor(kind="api_client", id="1", name="agent-1")
SYSTEM = Actor.system("test")
_counter = itertools.count(1)


def _next() -> int:
    return next(_counter)


def new_run(
    team: Team,
    *,
    title: str = "Quarterly report",
    agent: str = "report-bot",
    steps: tuple[str, ...] = ("plan", "search", "draft", "notify"),
    actor: Actor = AGENT,
    named: bool = True,
    **budget: Any,
) -> Run:
    """A pending run; `named` steps show a capitalised name, the others their key."""
    return services.run_create(
        team=team,
        title=title,
        agent=agent,
        actor=actor,
        steps=[services.PlannedStep(key, name=key.capitalize() if named else "") for key in steps],
        **budget,
    )


def start(run: Run, *, worker: str = "worker-1", ttl: float = 60, actor: Actor = AGENT) -> Lease:
    return services.lease_acquire(run_id=run.pk, worker_id=worker, ttl_seconds=ttl, actor=actor)


def make_run(
    team: Team, *, steps: tuple[str, ...] = ("plan", "act", "notify"), **budget: int
) -> Run:
    """A bare pending run made by the system actor, its steps named by their keys."""
    return new_run(team, steps=steps, actor=SYSTEM, named=False, **budget)


def make_running(team: Team, *, ttl: float = 30, **budget: int) -> tuple[Run, Lease]:
    """`make_run`, leased by worker-1 at epoch 1: running, nothing reported yet."""
    run = make_run(team, **budget)
    lease = start(run, ttl=ttl, actor=SYSTEM)
    run.refresh_from_db()
    return run, lease


def reload(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


def outbox_seen(run: Run) -> list[OutboxItem]:
    """The run's outbox items, oldest first, as every reader sees them: an item the stop's
    epoch froze is `frozen` before its row is relabelled (runs/frozen.py)."""
    current = reload(run)
    return frozen.present(current, OutboxItem.objects.filter(run=current).order_by("pk"))


def run_interrupt(*, run_id: str, actor: Actor = SYSTEM) -> Run:
    """The worker is lost: its lease runs out and the reaper interrupts the run
    (`services.lease_expire`), the way a running run becomes interrupted in production."""
    lease = Lease.objects.get(run_id=run_id, released_at__isnull=True)
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    services.lease_expire(lease_id=lease.pk, actor=actor)
    return Run.objects.get(pk=run_id)


def work(
    run: Run,
    lease: Lease,
    *,
    steps: int = 2,
    calls_per_step: int = 1,
    write_open: bool = False,
    outbox: int = 1,
    artifacts: int = 1,
) -> None:
    """Report steps, tool calls (finished), artifacts, a checkpoint and outbox items.

    With `write_open`, the last call is a write that is permitted but never reported: if the
    run is stopped now, its outcome is unknown and the stop ends dirty.
    """
    epoch = lease.epoch
    keys = [step.key for step in run.steps.order_by("seq")][:steps]
    n = _next()
    for index, key in enumerate(keys, start=1):
        services.events_ingest(
            run_id=run.pk,
            epoch=epoch,
            actor=AGENT,
            events=[
                {
                    "event_id": f"{key}-start-{n}",
                    "type": "step.started",
                    "key": key,
                    "kind": "tool_read",
                },
            ],
        )
        for call in range(calls_per_step):
            call_id = f"call_{n}_{index}_{call}"
            services.permit_request(
                run_id=run.pk,
                epoch=epoch,
                tool_call_id=call_id,
                tool="web.search",
                actor=AGENT,
                arguments={"q": key},
                step_key=key,
            )
            services.tool_result_report(
                run_id=run.pk,
                tool_call_id=call_id,
                execution_state="succeeded",
                actor=AGENT,
                observation=f"{key}: 12 results",
            )
        services.events_ingest(
            run_id=run.pk,
            epoch=epoch,
            actor=AGENT,
            events=[
                {"event_id": f"{key}-done-{n}", "type": "step.completed", "key": key},
                {
                    "event_id": f"{key}-cp-{n}",
                    "type": "checkpoint.saved",
                    "label": f"checkpoint_{index:02d}",
                    "state": {"after": key},
                    "step_seq": index,
                },
            ],
        )
    for index in range(artifacts):
        services.events_ingest(
            run_id=run.pk,
            epoch=epoch,
            actor=AGENT,
            events=[
                {
                    "event_id": f"artifact-{n}-{index}",
                    "type": "artifact.added",
                    "name": f"draft-{index}.md",
                    "kind": "markdown",
                    "content": "# Draft",
                    "reusable": True,
                },
            ],
        )
    for index in range(outbox):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=epoch,
            transport="email",
            destination="cfo@example.com",
            payload={"subject": "Report"},
            idempotency_key=f"mail-{n}-{index}",
            actor=AGENT,
        )
    if write_open:
        services.permit_request(
            run_id=run.pk,
            epoch=epoch,
            tool_call_id=f"deploy_{n}",
            tool="deploy.push",
            actor=AGENT,
            side_effect="write",
            operation_id=f"deploy-{n}",
            idempotency_key=f"deploy-key-{n}",
            recovery_policy="query_original",
        )


def running(team: Team, **kwargs: Any) -> tuple[Run, Lease]:
    run = new_run(team, **{k: v for k, v in kwargs.items() if k in ("title", "agent", "steps")})
    lease = start(run)
    work(run, lease, **{k: v for k, v in kwargs.items() if k not in ("title", "agent", "steps")})
    run.refresh_from_db()
    return run, lease


def stopped_dirty(team: Team, *, by: Actor | None = None, **kwargs: Any) -> Run:
    """Running with a write in flight; stopped; the worker drains without saying what happened."""
    run, lease = running(team, write_open=True, **kwargs)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=by or SYSTEM, note="looks wrong")
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
    )
    run.refresh_from_db()
    return run


def stopped_cleanly(team: Team, *, by: Actor | None = None, **kwargs: Any) -> Run:
    run, lease = running(team, **kwargs)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=by or SYSTEM, note="pause")
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
    )
    run.refresh_from_db()
    return run


def handed_off(team: Team, *, by: Actor, **kwargs: Any) -> Run:
    run, lease = running(team, **kwargs)
    services.steering_queue(run_id=run.pk, text="Use the Q3 numbers, not Q2.", actor=by)
    services.run_takeover(run_id=run.pk, actor=by, note="I will finish this by hand")
    services.run_drained(
        run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT, observations=[]
    )
    run.refresh_from_db()
    return run


def completed(team: Team, **kwargs: Any) -> Run:
    run, lease = running(team, **kwargs)
    run_complete(run_id=run.pk, epoch=lease.epoch, actor=AGENT, result={"ok": True})
    run.refresh_from_db()
    return run


def failed(team: Team, **kwargs: Any) -> Run:
    run, lease = running(team, **kwargs)
    run_fail(run_id=run.pk, epoch=lease.epoch, actor=AGENT, error={"message": "model refused"})
    run.refresh_from_db()
    return run


def interrupted(team: Team, *, outbox_in_flight: bool = False, **kwargs: Any) -> Run:
    """Running with a write in flight (unless `write_open=False`) and, with `outbox_in_flight`,
    an outbox item claimed and never reported; then the worker is lost (its lease runs out):
    interrupted, and the interruption leaves those unknown."""
    run, _lease = running(team, **{"write_open": True, **kwargs})
    if outbox_in_flight:
        item = run.outbox_items.order_by("pk").first()
        assert item is not None and services.outbox_claim(item_id=item.pk, dispatcher="d-1")
    run_interrupt(run_id=run.pk)
    run.refresh_from_db()
    return run
