"""The worker's event batches: steps, artifacts, checkpoints, applied steering, and the run's
own suspend / complete / fail. One transaction and one run lock per batch; every event answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Q
from django.utils import timezone

from runs.actors import Actor
from runs.ledger import ledger_append
from runs.models import (
    STOPPED_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    Artifact,
    Checkpoint,
    EventReceipt,
    LeaseReleaseReason,
    RejectedWrite,
    Run,
    RunStatus,
    SteeringMessage,
    SteeringStatus,
    Step,
    StepKind,
    StepStatus,
)
from runs.services._base import (
    _changed,
    _live_lease,
    _move,
    _release_lease,
    locked_run,
)


@dataclass
class EventAnswer:
    event_id: str
    status: str  # accepted | duplicate | rejected
    code: str = ""
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"event_id": self.event_id, "status": self.status}
        if self.code:
            body["code"] = self.code
        if self.detail:
            body["detail"] = self.detail
        return body


class _EventRejected(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


EVENT_TYPES = (
    "step.started",
    "step.completed",
    "step.failed",
    "artifact.added",
    "checkpoint.saved",
    "steering.applied",
    "run.suspended",
    "run.completed",
    "run.failed",
)


_FORWARD_EVENTS = {
    "step.started",
    "steering.applied",
    "run.suspended",
    "run.completed",
    "run.failed",
}


def events_ingest(
    *, run_id: str, epoch: int, events: list[dict[str, Any]], actor: Actor
) -> list[EventAnswer]:
    """Apply a batch in one transaction under one run lock; answer every event."""
    with locked_run(run_id) as run:
        now = timezone.now()
        ids = [str(event.get("event_id", "")) for event in events]
        seen = dict(
            EventReceipt.objects.filter(run=run, event_id__in=ids).values_list(
                "event_id", "outcome"
            )
        )
        answers: list[EventAnswer] = []
        receipts: list[EventReceipt] = []
        stale = 0
        steps = _BatchSteps(run, events)
        for event in events:
            event_id = str(event.get("event_id", ""))
            event_type = str(event.get("type", ""))
            if event_id in seen:
                answers.append(EventAnswer(event_id, "duplicate"))
                continue
            try:
                _apply_event(run, event_type, event, epoch=epoch, actor=actor, now=now, steps=steps)
                answer = EventAnswer(event_id, "accepted")
            except _EventRejected as rejected:
                answer = EventAnswer(event_id, "rejected", rejected.code, rejected.detail)
                stale += rejected.code == "stale_epoch"
            seen[event_id] = answer.status
            answers.append(answer)
            receipts.append(
                EventReceipt(
                    run=run,
                    event_id=event_id,
                    type=event_type[:40],
                    epoch=epoch,
                    outcome=answer.status,
                    code=answer.code,
                )
            )
        steps.flush()
        EventReceipt.objects.bulk_create(receipts)
        if stale:
            RejectedWrite.objects.bulk_create(
                RejectedWrite(
                    run=run, kind="event", epoch=epoch, run_epoch=run.stop_epoch, code="stale_epoch"
                )
                for _ in range(stale)
            )
            run.late_writes_rejected += stale
            run.save(update_fields=["late_writes_rejected"])
        if (
            any(answer.status == "accepted" for answer in answers)
            and run.status not in TERMINAL_STATUSES
        ):
            _changed(run, kind="events")
    return answers


_STEP_EVENT_FIELDS = [
    "name",
    "kind",
    "status",
    "epoch",
    "started_at",
    "finished_at",
    "reported_after_stop",
    "detail",
]


class _BatchSteps:
    """The steps one events batch names: read in one query, changed in memory, written once.

    Under the run lock nobody else writes this run's steps, so the objects here are what the
    database holds plus this batch's changes. `flush()` writes them: new steps in one INSERT
    (a step started and completed in the same batch is inserted completed), changed ones in one
    UPDATE. Before, every step event cost a lookup and a write of its own, and every new step a
    read of the last seq (docs/BENCHMARKS.md, ingestion).
    """

    def __init__(self, run: Run, events: list[dict[str, Any]]) -> None:
        self.run = run
        keys = {
            str(value)[:120]
            for event in events
            for name in ("key", "step_key")
            if isinstance(value := event.get(name), str | int | float) and str(value)
        }
        # One query for the named steps *and* the run's last step (its seq numbers the new ones):
        # a single-event request used to spend a second round trip on "SELECT max(seq)".
        last_step = Step.objects.filter(run=run).order_by("-seq").values("pk")[:1]
        found = (
            list(Step.objects.filter(Q(key__in=keys) | Q(pk__in=last_step), run=run))
            if keys
            else []
        )
        self.by_key = {step.key: step for step in found if step.key in keys}
        self._next_seq: int | None = (
            max((step.seq for step in found), default=0) + 1 if keys else None
        )
        self._new: list[Step] = []
        self._changed: dict[int, Step] = {}

    def get(self, key: str) -> Step | None:
        return self.by_key.get(key)

    def saved(self, key: str) -> Step | None:
        """The step, with a primary key (for a row that points at it)."""
        step = self.by_key.get(key)
        if step is not None and step.pk is None:
            self.flush()
        return step

    def new(self, key: str) -> Step:
        if self._next_seq is None:
            last = (
                Step.objects.filter(run=self.run)
                .order_by("-seq")
                .values_list("seq", flat=True)
                .first()
            )
            self._next_seq = (last or 0) + 1
        step = Step(run=self.run, seq=self._next_seq, key=key)
        self._next_seq += 1
        self.by_key[key] = step
        self._new.append(step)
        return step

    def changed(self, step: Step) -> None:
        if step.pk is not None:  # a new step is inserted whole by flush()
            self._changed[step.pk] = step

    def flush(self) -> None:
        if self._new:
            Step.objects.bulk_create(self._new)
            self._new = []
        if len(self._changed) == 1:
            # One step (every single-event request): a plain UPDATE. bulk_update's CASE WHEN per
            # field cost more to compile than the rest of the request's queries together.
            (step,) = self._changed.values()
            step.save(update_fields=_STEP_EVENT_FIELDS)
        elif self._changed:
            Step.objects.bulk_update(list(self._changed.values()), _STEP_EVENT_FIELDS)
        self._changed = {}


def _apply_event(
    run: Run,
    event_type: str,
    event: dict[str, Any],
    *,
    epoch: int,
    actor: Actor,
    now: Any,
    steps: _BatchSteps,
) -> None:
    if event_type not in EVENT_TYPES:
        raise _EventRejected("unknown_event_type", f"type must be one of {', '.join(EVENT_TYPES)}")
    if event_type in _FORWARD_EVENTS:
        if epoch != run.stop_epoch:
            _keep_late_outcome(run, event_type, event, epoch=epoch, actor=actor, now=now)
            raise _EventRejected(
                "stale_epoch", f"epoch {epoch} is not the run's current epoch {run.stop_epoch}"
            )
        if run.status != RunStatus.RUNNING:
            raise _EventRejected("run_not_running", f"the run is {run.status}")
    elif epoch > run.stop_epoch:
        raise _EventRejected(
            "stale_epoch", f"epoch {epoch} is ahead of the run's epoch {run.stop_epoch}"
        )
    handler = _EVENT_HANDLERS[event_type]
    handler(run, event, epoch=epoch, actor=actor, now=now, steps=steps)


def _keep_late_outcome(
    run: Run, event_type: str, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any
) -> None:
    """DESIGN §2: a completion after the stop does not move the run but is kept as a fact."""
    if event_type not in ("run.completed", "run.failed"):
        return
    report = {
        "type": event_type,
        "epoch": epoch,
        "at": now.isoformat(),
        "event_id": event.get("event_id"),
        "result": event.get("result"),
        "error": event.get("error"),
        "reported_after_stop": True,
    }
    run.late_reports = [*run.late_reports, report]
    run.save(update_fields=["late_reports"])
    ledger_append(
        run=run,
        actor=actor,
        action="run.outcome_reported_after_stop",
        reason=event_type,
        payload={"epoch": epoch, "event_id": event.get("event_id")},
    )


def _text(event: dict[str, Any], key: str, default: str = "", limit: int = 300) -> str:
    value = event.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str | int | float):
        raise _EventRejected("invalid", f"{key} must be a string")
    return str(value)[:limit]


def _on_step_started(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    key = _text(event, "key", limit=120)
    if not key:
        raise _EventRejected("invalid", "step.started needs a key")
    kind = _text(event, "kind", StepKind.MODEL_CALL)
    if kind not in StepKind.values:
        raise _EventRejected("invalid", f"kind must be one of {', '.join(StepKind.values)}")
    existing = steps.get(key)
    # Validate everything before a new step takes a seq (a rejected event writes nothing).
    name = _text(event, "name", (existing.name if existing else "") or key)
    step = existing or steps.new(key)
    step.name = name
    step.kind = kind
    step.status = StepStatus.RUNNING
    step.epoch = epoch
    step.started_at = now
    step.finished_at = None
    steps.changed(step)


def _step_owned_by_epoch(run: Run, event: dict[str, Any], epoch: int, steps: _BatchSteps) -> Step:
    key = _text(event, "key", limit=120)
    step = steps.get(key)
    if step is None:
        raise _EventRejected("unknown_step", f"no step {key!r} on this run")
    if step.epoch != epoch:
        # An old worker may report on the steps *it* ran, never on a newer round's.
        raise _EventRejected(
            "stale_epoch", f"step {key!r} belongs to epoch {step.epoch}, not {epoch}"
        )
    return step


def _on_step_finished(status: str) -> Any:
    def handler(
        run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
    ) -> None:
        step = _step_owned_by_epoch(run, event, epoch, steps)
        step.status = status
        step.finished_at = now
        step.reported_after_stop = epoch < run.stop_epoch
        detail = event.get("detail") or event.get("error")
        if detail is not None:
            step.detail = detail if isinstance(detail, dict) else {"detail": str(detail)[:2000]}
        steps.changed(step)

    return handler


def _on_artifact_added(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    name = _text(event, "name")
    if not name:
        raise _EventRejected("invalid", "artifact.added needs a name")
    step_key = _text(event, "step_key", limit=120)
    Artifact.objects.create(
        run=run,
        step=steps.saved(step_key) if step_key else None,
        name=name,
        kind=_text(event, "kind", limit=60),
        uri=_text(event, "uri", limit=1000),
        content=_text(event, "content", limit=100_000),
        checksum=_text(event, "checksum", limit=128),
        reusable=bool(event.get("reusable", False)),
        evidence=bool(event.get("evidence", False)),
        epoch=epoch,
    )


def _on_checkpoint_saved(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    label = _text(event, "label", limit=120)
    if not label:
        raise _EventRejected("invalid", "checkpoint.saved needs a label")
    state = event.get("state") or {}
    if not isinstance(state, dict):
        raise _EventRejected("invalid", "state must be an object")
    step_seq = event.get("step_seq")
    Checkpoint.objects.create(
        run=run,
        label=label,
        state=state,
        epoch=epoch,
        step_seq=step_seq if isinstance(step_seq, int) and step_seq >= 0 else None,
    )
    # Only the epoch being stopped (or the running one) may move the resume point; an older
    # round's checkpoint is kept but never redirects a newer round.
    if epoch == run.stop_epoch or (
        epoch == run.stop_epoch - 1 and run.status in (*STOPPING_STATUSES, *STOPPED_STATUSES)
    ):
        run.resume_from = label
        run.save(update_fields=["resume_from"])


def _on_steering_applied(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    message_id = event.get("steering_id")
    updated = SteeringMessage.objects.filter(
        run=run,
        pk=message_id if isinstance(message_id, int) else -1,
        status__in=(SteeringStatus.QUEUED, SteeringStatus.CARRIED_OVER),
    ).update(status=SteeringStatus.APPLIED, applied_at=now)
    if not updated:
        raise _EventRejected("unknown_steering", f"no queued steering message {message_id!r}")


def _on_run_suspended(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    lease = _live_lease(run)
    if lease is not None:
        _release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    run.interruption = {
        "suspended_because": _text(event, "reason", limit=500),
        "at": now.isoformat(),
    }
    _move(
        run,
        RunStatus.SUSPENDED,
        actor=actor,
        action="run.suspended",
        reason=_text(event, "reason", limit=60),
        fields=("interruption",),
    )


def _on_run_completed(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    _finish_locked(run, RunStatus.COMPLETED, actor=actor, now=now, result=event.get("result"))


def _on_run_failed(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: Any, steps: _BatchSteps
) -> None:
    error = event.get("error")
    _finish_locked(
        run,
        RunStatus.FAILED,
        actor=actor,
        now=now,
        failure=error if isinstance(error, dict) else {"error": str(error)},
    )


_EVENT_HANDLERS = {
    "step.started": _on_step_started,
    "step.completed": _on_step_finished(StepStatus.COMPLETED),
    "step.failed": _on_step_finished(StepStatus.FAILED),
    "artifact.added": _on_artifact_added,
    "checkpoint.saved": _on_checkpoint_saved,
    "steering.applied": _on_steering_applied,
    "run.suspended": _on_run_suspended,
    "run.completed": _on_run_completed,
    "run.failed": _on_run_failed,
}


def _finish_locked(
    run: Run, to: str, *, actor: Actor, now: Any, result: Any = None, failure: Any = None
) -> None:
    lease = _live_lease(run)
    if lease is not None:
        _release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    run.finished_at = now
    fields = ["finished_at"]
    if to == RunStatus.COMPLETED:
        run.result = result
        fields.append("result")
    else:
        run.failure = failure
        fields.append("failure")
    _move(run, to, actor=actor, action=f"run.{to}", fields=tuple(fields))
