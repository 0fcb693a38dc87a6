"""The run page: its steps, tool calls, outbox and artifacts, windowed to the newest."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db.models import Count, Q, Subquery, Window
from django.utils import timezone

from console.selectors.packets import StopHistory, stop_history
from handoff.models import Handoff, StopPacket
from runs import frozen
from runs.models import (
    OUTBOX_IN_FLIGHT_STATUSES,
    UNCONFIRMED_SIDE_EFFECT,
    Approval,
    Artifact,
    Checkpoint,
    ExecutionRecord,
    Lease,
    LedgerEntry,
    OutboxItem,
    OutboxStatus,
    Run,
    SteeringMessage,
    SteeringStatus,
    Step,
    StopRequest,
    is_unconfirmed_side_effect,
)

RUN_LEDGER_LIMIT = 200
# The run page shows the newest steps and tool calls (and every unresolved call, whatever its
# age): rendering 5,000 steps took a second (docs/BENCHMARKS.md). "Show all" lifts the window.
RUN_STEP_WINDOW = 200
# Outbox items that went out (or were discarded) and artifacts are history too: the newest
# RUN_HISTORY_WINDOW of each. An item still open — held, pending, in flight, unknown, failed,
# frozen or released — is always shown, whatever its age. (The page of a run with 300 of each
# spent most of its time rendering them, docs/BENCHMARKS.md.)
RUN_HISTORY_WINDOW = 100
OUTBOX_SETTLED = (OutboxStatus.SENT, OutboxStatus.DISCARDED)


@dataclass
class StepView:
    step: Step
    calls: list[ExecutionRecord]


@dataclass
class RunDetail:
    run: Run
    steps: list[StepView]
    loose_calls: list[ExecutionRecord]
    calls: list[ExecutionRecord]
    outbox: list[OutboxItem]
    artifacts: list[Artifact]
    checkpoints: list[Checkpoint]
    steering: list[SteeringMessage]
    lease: Lease | None
    live_lease: bool
    stop_request: StopRequest | None
    packets: list[dict[str, Any]]
    handoff: Handoff | None
    ledger: list[LedgerEntry]
    ledger_total: int
    unresolved: int
    steps_total: int = 0
    calls_total: int = 0
    outbox_total: int = 0
    artifacts_total: int = 0

    @property
    def windowed(self) -> bool:
        return (
            self.steps_total > len(self.steps)
            or self.calls_total > len(self.calls)
            or self.outbox_total > len(self.outbox)
            or self.artifacts_total > len(self.artifacts)
        )

    @property
    def lease_expired(self) -> bool:
        """A live lease past its expiry: the worker missed its heartbeats (the reaper will act)."""
        return (
            self.live_lease and self.lease is not None and self.lease.expires_at <= timezone.now()
        )

    @property
    def unapplied_steering(self) -> list[SteeringMessage]:
        return [
            message
            for message in self.steering
            if message.status == SteeringStatus.UNAPPLIED_AT_STOP
        ]

    @property
    def latest_packet_epoch(self) -> int | None:
        return self.packets[0]["stop_epoch"] if self.packets else None

    @cached_property
    def stop_history(self) -> StopHistory | None:
        """The latest stop as it happened, if it settled dirty: queried only where it is shown."""
        return stop_history(stop_request=self.stop_request) if self.stop_request else None


def _latest_steps(run: Run, window: int | None) -> tuple[list[Step], int]:
    if window is None:
        steps = list(Step.objects.filter(run=run).order_by("seq"))
        return steps, len(steps)
    # COUNT(*) OVER () is computed before the LIMIT: the total rides along with the window, so a
    # 5,000-step run costs the same number of queries as a 10-step one.
    newest: list[Any] = list(
        Step.objects.filter(run=run).annotate(total=Window(Count("pk"))).order_by("-seq")[:window]
    )
    return newest[::-1], newest[0].total if newest else 0


def _latest_calls(run: Run, window: int | None) -> tuple[list[ExecutionRecord], int]:
    calls = ExecutionRecord.objects.filter(run=run)
    if window is None:
        found = list(calls.order_by("permitted_at", "pk"))
        return found, len(found)
    newest = calls.order_by("-permitted_at", "-pk").values("pk")[:window]
    unresolved = UNCONFIRMED_SIDE_EFFECT
    # The total is of every call, not of the ones loaded: a scalar subquery in the same query.
    every_call = (
        ExecutionRecord.objects.filter(run=run).values("run").annotate(n=Count("pk")).values("n")
    )
    loaded: list[Any] = list(
        calls.filter(Q(pk__in=newest) | unresolved)
        .annotate(total=Subquery(every_call))
        .order_by("permitted_at", "pk")
    )
    return loaded, loaded[0].total if loaded else 0


def _latest_outbox(run: Run, window: int | None) -> tuple[list[OutboxItem], int]:
    # An item the run's epoch froze shows frozen before its row is relabelled (`runs.frozen`).
    items = OutboxItem.objects.filter(run=run)
    if window is None:
        found = frozen.present(run, items.order_by("pk"))
        return found, len(found)
    newest = items.order_by("-pk").values("pk")[:window]
    every_item = (
        OutboxItem.objects.filter(run=run).values("run").annotate(n=Count("pk")).values("n")
    )
    loaded: list[Any] = frozen.present(
        run,
        items.filter(Q(pk__in=newest) | ~Q(status__in=OUTBOX_SETTLED))
        .annotate(total=Subquery(every_item))
        .order_by("pk"),
    )
    return loaded, loaded[0].total if loaded else 0


def _latest_artifacts(run: Run, window: int | None) -> tuple[list[Artifact], int]:
    if window is None:
        found = list(Artifact.objects.filter(run=run).order_by("pk"))
        return found, len(found)
    newest: list[Any] = list(
        Artifact.objects.filter(run=run)
        .annotate(total=Window(Count("pk")))
        .order_by("-pk")[:window]
    )
    return newest[::-1], newest[0].total if newest else 0


def run_detail(run: Run, *, everything: bool = False) -> RunDetail:
    """A bounded number of queries whatever the run's size; children are grouped in Python.

    Without `everything`, only the newest RUN_STEP_WINDOW steps and calls are loaded (plus every
    unresolved call), and the newest RUN_HISTORY_WINDOW sent or discarded outbox items (plus
    every open one) and artifacts: a reviewer needs the recent work and every unknown, not
    5,000 rows."""
    window = None if everything else RUN_STEP_WINDOW
    steps, steps_total = _latest_steps(run, window)
    calls, calls_total = _latest_calls(run, window)
    by_step: dict[int | None, list[ExecutionRecord]] = defaultdict(list)
    for call in calls:
        by_step[call.step_id].append(call)
    steps_by_id = {step.pk: step for step in steps}
    for call in calls:  # avoid a lazy `call.step` query per row in the template
        if call.step_id is not None:
            call.step = steps_by_id.get(call.step_id)
    outbox, outbox_total = _latest_outbox(run, None if everything else RUN_HISTORY_WINDOW)
    artifacts, artifacts_total = _latest_artifacts(run, None if everything else RUN_HISTORY_WINDOW)
    lease = Lease.objects.filter(run=run).order_by("-acquired_at", "-pk").first()
    ledger = list(LedgerEntry.objects.filter(run=run).order_by("-run_seq")[:RUN_LEDGER_LIMIT])
    unresolved = sum(
        1
        for call in calls
        if is_unconfirmed_side_effect(
            side_effect=call.side_effect,
            side_effect_state=call.side_effect_state,
            resolved=call.resolved,
        )
    ) + sum(1 for item in outbox if item.status in OUTBOX_IN_FLIGHT_STATUSES and not item.resolved)
    return RunDetail(
        run=run,
        steps=[StepView(step, by_step.get(step.pk, [])) for step in steps],
        loose_calls=by_step.get(None, []),
        calls=calls,
        outbox=outbox,
        artifacts=artifacts,
        checkpoints=list(Checkpoint.objects.filter(run=run).order_by("pk")),
        steering=list(SteeringMessage.objects.filter(run=run).order_by("pk")),
        lease=lease,
        live_lease=lease is not None and lease.released_at is None,
        stop_request=StopRequest.objects.filter(run=run).order_by("-epoch_after").first(),
        packets=[
            dict(row)
            for row in StopPacket.objects.filter(run=run)
            .order_by("-stop_epoch")
            .values("stop_epoch", "created_at")
        ],
        handoff=Handoff.objects.filter(run=run)
        .select_related("assignee")
        .order_by("-created_at", "-pk")
        .first(),
        ledger=ledger,
        # run_seq counts this run's entries, so the newest one says how many there are.
        ledger_total=ledger[0].run_seq if ledger else 0,
        unresolved=unresolved,
        steps_total=steps_total,
        calls_total=calls_total,
        outbox_total=outbox_total,
        artifacts_total=artifacts_total,
    )


def checkpoint_labels(*, run_id: str) -> list[str]:
    """The run's resume points, oldest first (the choices of a resume or return form)."""
    return list(
        Checkpoint.objects.filter(run_id=run_id).order_by("pk").values_list("label", flat=True)
    )


def outbox_item_get(*, run_id: str, item_id: int) -> OutboxItem | None:
    return OutboxItem.objects.filter(run_id=run_id, pk=item_id).first()


def run_approvals(run: Run, *, limit: int = 100) -> list[Approval]:
    """The approvals a run asked for, newest first (the run page's list): one query."""
    return list(
        Approval.objects.filter(run=run)
        .defer("arguments", "original_arguments", "arguments_schema")
        .order_by("-requested_at", "-pk")[:limit]
    )
