"""The worker's event batches: steps, artifacts, checkpoints, applied steering, usage, and the
run's own suspend / complete / fail. One transaction and one run lock per batch; every event
answered.

What each event does is here; how the batch reads and writes its rows (two round trips on
PostgreSQL whatever its size) is `_events_sql`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.utils import timezone

from runs import hooks, notify
from runs.actors import Actor
from runs.ledger import ledger_append
from runs.models import (
    STOPPED_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    Artifact,
    Checkpoint,
    LeaseReleaseReason,
    RejectedWrite,
    Run,
    RunStatus,
    SteeringMessage,
    SteeringStatus,
    Step,
    StepKind,
    StepStatus,
    StopReason,
    Usage,
)
from runs.pricing import price_call
from runs.services._base import live_lease, release_lease, run_move
from runs.services._events_sql import EventBatch, TokenCheck, TokenNoLongerValid, open_batch
from runs.services.budget import budget_note, exhausted_spend_budget
from runs.services.lifecycle import stop_locked
from runs.services.team_budgets import team_budget_charge

__all__ = ["EVENT_TYPES", "EventAnswer", "TokenCheck", "TokenNoLongerValid", "events_ingest"]


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
    "usage",
)


_FORWARD_EVENTS = {
    "step.started",
    "steering.applied",
    "run.suspended",
    "run.completed",
    "run.failed",
}

# Events whose handlers read or write beyond the batch's own rows (the lease, the ledger,
# steering, the run's status): the batch's pending rows are written before they run.
_WIDE_EVENTS = {"steering.applied", "run.suspended", "run.completed", "run.failed"}


def events_ingest(
    *,
    run_id: str,
    epoch: int,
    events: list[dict[str, Any]],
    actor: Actor,
    token_check: TokenCheck | None = None,
) -> list[EventAnswer]:
    """Apply a batch in one transaction under one run lock; answer every event.

    `token_check`: re-check the caller's token in the locking query; `TokenNoLongerValid`
    (nothing written) when it no longer holds.
    """
    ids = [str(event.get("event_id", "")) for event in events]
    keys = _step_keys(events)
    checks = hooks.policies()
    with transaction.atomic(durable=True):
        opening = open_batch(run_id, ids, keys, token_check, also=checks.version_read(run_id))
        run, seen = opening.run, opening.seen
        # No policy of the team looks at events: nothing is checked after the batch's writes.
        quiet = checks.events_quiet(run.team_id, opening.also)
        now = timezone.now()
        batch = EventBatch(run, keys, opening.found, now)
        answers: list[EventAnswer] = []
        stale = 0
        for event_id, event in zip(ids, events, strict=True):
            event_type = str(event.get("type", ""))
            if event_id in seen:
                answers.append(EventAnswer(event_id, "duplicate"))
                continue
            try:
                _apply_event(run, event_type, event, epoch=epoch, actor=actor, now=now, batch=batch)
                answer = EventAnswer(event_id, "accepted")
            except _EventRejected as rejected:
                answer = EventAnswer(event_id, "rejected", rejected.code, rejected.detail)
                stale += rejected.code == "stale_epoch"
            seen[event_id] = answer.status
            answers.append(answer)
            batch.receipt(event_id, event_type[:40], epoch, answer.status, answer.code)
        if stale:
            RejectedWrite.objects.bulk_create(
                RejectedWrite(
                    run=run, kind="event", epoch=epoch, run_epoch=run.stop_epoch, code="stale_epoch"
                )
                for _ in range(stale)
            )
            run.late_writes_rejected += stale
            batch.run_fields.add("late_writes_rejected")
        touch = (
            any(answer.status == "accepted" for answer in answers)
            and run.status not in TERMINAL_STATUSES
        )
        # Usage that reaches a cost or token budget stops the run in this same transaction,
        # under the lock that counted it: no permit can slip in between.
        budget = (
            exhausted_spend_budget(run) if batch.spent and run.status == RunStatus.RUNNING else ""
        )
        note = budget_note(run, budget) if budget else ""
        # What the team's policies read goes with the batch's writes, after them: one round
        # trip, where it was one more of its own (docs/BENCHMARKS.md, single events).
        checked_after = not quiet and run.status == RunStatus.RUNNING
        read = checks.read(run.pk) if touch and not note and checked_after else None
        # Nothing is written after the batch's rows when no spend is to be charged and no
        # policy checks them: the COMMIT goes in the same round trip.
        last = not checked_after and not batch.spent
        checked = batch.flush(touch=touch, read=read, commit=last)
        if touch:
            notify.run_changed(run, kind="events")
        note = note or _charge_team_budget(run, batch, now)
        if note:
            stop_locked(
                run,
                reason=StopReason.BUDGET_EXHAUSTED,
                note=note,
                actor=Actor.system("budget"),
                now=now,
            )
        # The team's policies see the batch's facts written, in this same transaction.
        if run.status == RunStatus.RUNNING and not quiet:
            checks.events(run, _accepted_types(events, answers), now=now, read=checked)
    return answers


def _charge_team_budget(run: Run, batch: EventBatch, now: datetime) -> str:
    """The batch's priced spend counts on the team's budget too (late spend included: the
    bill comes all the same); the note of the team budget it used up, if the run still runs."""
    if not batch.cost_usd:
        return ""
    charge = team_budget_charge(run, batch.cost_usd, now=now)
    if charge is None or not charge.exhausted or run.status != RunStatus.RUNNING:
        return ""
    return charge.note


def _accepted_types(events: list[dict[str, Any]], answers: list[EventAnswer]) -> list[str]:
    return [
        str(event.get("type", ""))
        for event, answer in zip(events, answers, strict=True)
        if answer.status == "accepted"
    ]


def _step_keys(events: Iterable[dict[str, Any]]) -> set[str]:
    return {
        str(value)[:120]
        for event in events
        for name in ("key", "step_key")
        if isinstance(value := event.get(name), str | int | float) and str(value)
    }


def _apply_event(
    run: Run,
    event_type: str,
    event: dict[str, Any],
    *,
    epoch: int,
    actor: Actor,
    now: datetime,
    batch: EventBatch,
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
    if event_type in _WIDE_EVENTS:
        batch.flush()
    handler(run, event, epoch=epoch, actor=actor, now=now, batch=batch)


def _keep_late_outcome(
    run: Run, event_type: str, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime
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
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
) -> None:
    key = _text(event, "key", limit=120)
    if not key:
        raise _EventRejected("invalid", "step.started needs a key")
    kind = _text(event, "kind", StepKind.MODEL_CALL)
    if kind not in StepKind.values:
        raise _EventRejected("invalid", f"kind must be one of {', '.join(StepKind.values)}")
    existing = batch.get(key)
    # Validate everything before a new step takes a seq (a rejected event writes nothing).
    name = _text(event, "name", (existing.name if existing else "") or key)
    step = existing or batch.new(key)
    step.name = name
    step.kind = kind
    step.status = StepStatus.RUNNING
    step.epoch = epoch
    step.started_at = now
    step.finished_at = None
    batch.changed(step)


def _step_owned_by_epoch(run: Run, event: dict[str, Any], epoch: int, batch: EventBatch) -> Step:
    key = _text(event, "key", limit=120)
    step = batch.get(key)
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
        run: Run,
        event: dict[str, Any],
        *,
        epoch: int,
        actor: Actor,
        now: datetime,
        batch: EventBatch,
    ) -> None:
        step = _step_owned_by_epoch(run, event, epoch, batch)
        step.status = status
        step.finished_at = now
        step.reported_after_stop = epoch < run.stop_epoch
        detail = event.get("detail") or event.get("error")
        if detail is not None:
            step.detail = detail if isinstance(detail, dict) else {"detail": str(detail)[:2000]}
        batch.changed(step)

    return handler


def _on_artifact_added(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
) -> None:
    name = _text(event, "name")
    if not name:
        raise _EventRejected("invalid", "artifact.added needs a name")
    step_key = _text(event, "step_key", limit=120)
    step = batch.saved(step_key) if step_key else None
    batch.artifacts.append(
        Artifact(
            run=run,
            step_id=step.pk if step is not None else None,
            name=name,
            kind=_text(event, "kind", limit=60),
            uri=_text(event, "uri", limit=1000),
            content=_text(event, "content", limit=100_000),
            checksum=_text(event, "checksum", limit=128),
            reusable=bool(event.get("reusable", False)),
            evidence=bool(event.get("evidence", False)),
            epoch=epoch,
            created_at=now,
        )
    )


def _on_checkpoint_saved(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
) -> None:
    label = _text(event, "label", limit=120)
    if not label:
        raise _EventRejected("invalid", "checkpoint.saved needs a label")
    state = event.get("state") or {}
    if not isinstance(state, dict):
        raise _EventRejected("invalid", "state must be an object")
    step_seq = event.get("step_seq")
    batch.checkpoints.append(
        Checkpoint(
            run=run,
            label=label,
            state=state,
            epoch=epoch,
            step_seq=step_seq if isinstance(step_seq, int) and step_seq >= 0 else None,
            created_at=now,
        )
    )
    # Only the epoch being stopped (or the running one) may move the resume point; an older
    # round's checkpoint is kept but never redirects a newer round.
    if epoch == run.stop_epoch or (
        epoch == run.stop_epoch - 1 and run.status in (*STOPPING_STATUSES, *STOPPED_STATUSES)
    ):
        run.resume_from = label
        batch.run_fields.add("resume_from")


def _on_steering_applied(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
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
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
) -> None:
    lease = live_lease(run)
    if lease is not None:
        release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    run.interruption = {
        "suspended_because": _text(event, "reason", limit=500),
        "at": now.isoformat(),
    }
    run_move(
        run,
        RunStatus.SUSPENDED,
        actor=actor,
        action="run.suspended",
        reason=_text(event, "reason", limit=60),
        fields=("interruption",),
    )


def _on_run_completed(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
) -> None:
    _finish_locked(run, RunStatus.COMPLETED, actor=actor, now=now, result=event.get("result"))


def _on_run_failed(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
) -> None:
    error = event.get("error")
    _finish_locked(
        run,
        RunStatus.FAILED,
        actor=actor,
        now=now,
        failure=error if isinstance(error, dict) else {"error": str(error)},
    )


# One call's counts: no model reads or writes this many tokens in one call, and no call costs
# this much; a larger figure is a bug in the reporter (a cumulative total, a unit mix-up), and
# counting it would stop runs on budgets they never spent.
MAX_CALL_TOKENS = 100_000_000
MAX_CALL_COST_USD = Decimal(10_000)
_COST_PLACES = Decimal("1e-10")  # Usage.cost_usd's scale: stored sums equal the rows' sums
_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
_STEP_KEY_LIMIT = 120  # Usage.step_key


def _tokens(event: dict[str, Any], key: str, *, required: bool) -> int:
    value = event.get(key)
    if value is None:
        if required:
            raise _EventRejected("invalid", f"usage needs {key}")
        return 0
    if type(value) is not int:  # not bool, not 12.5, not "12"
        raise _EventRejected("invalid", f"{key} must be a whole number of tokens")
    if value < 0:
        raise _EventRejected("invalid", f"{key} must not be negative")
    if value > MAX_CALL_TOKENS:
        raise _EventRejected(
            "invalid", f"{key} {value} is more than one call can use ({MAX_CALL_TOKENS})"
        )
    return value


def _cost(event: dict[str, Any]) -> Decimal | None:
    value = event.get("cost_usd")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _EventRejected("invalid", "cost_usd must be a number")
    try:
        cost = Decimal(str(value).strip())
    except InvalidOperation:
        raise _EventRejected("invalid", "cost_usd must be a number") from None
    if not cost.is_finite():
        raise _EventRejected("invalid", "cost_usd must be a finite number")
    if cost < 0:
        raise _EventRejected("invalid", "cost_usd must not be negative")
    if cost > MAX_CALL_COST_USD:
        raise _EventRejected(
            "invalid", f"cost_usd {cost} is more than one call can cost ({MAX_CALL_COST_USD})"
        )
    return cost.quantize(_COST_PLACES)


def _name(event: dict[str, Any], key: str, limit: int) -> str:
    value = event.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _EventRejected("invalid", f"{key} must be a string")
    value = value.strip()
    if len(value) > limit:
        # Refused, not cut: a cut name could price as another model.
        raise _EventRejected("invalid", f"{key} is longer than {limit} characters")
    return value


def _on_usage(
    run: Run, event: dict[str, Any], *, epoch: int, actor: Actor, now: datetime, batch: EventBatch
) -> None:
    """One model call's tokens, priced now (DESIGN §13). A fact: accepted after a stop too (the
    bill still comes), and then counted as late spend. Everything is checked before anything
    is kept, so a rejected event changes no row and no total."""
    cost = _cost(event)
    model = _name(event, "model", 200)
    if not model:
        raise _EventRejected(
            "invalid", "cost_usd needs a model" if cost is not None else "usage needs a model"
        )
    provider = _name(event, "provider", 100)
    counts = {key: _tokens(event, key, required=key in _TOKEN_FIELDS[:2]) for key in _TOKEN_FIELDS}
    if counts["cache_read_tokens"] + counts["cache_write_tokens"] > counts["input_tokens"]:
        raise _EventRejected(
            "invalid",
            "cache_read_tokens + cache_write_tokens exceed input_tokens "
            "(input_tokens counts every input token, cached or not)",
        )
    step_key = _text(event, "step_key", limit=_STEP_KEY_LIMIT + 1)
    if len(step_key) > _STEP_KEY_LIMIT:  # refused, not cut: a cut key names another step
        raise _EventRejected("invalid", f"step_key is longer than {_STEP_KEY_LIMIT} characters")
    price = price_call(
        model=model,
        provider=provider,
        input_tokens=counts["input_tokens"],
        output_tokens=counts["output_tokens"],
        cache_read_tokens=counts["cache_read_tokens"],
        cache_write_tokens=counts["cache_write_tokens"],
        reported_cost_usd=cost,
        at=now,
        team_prices=batch.team_prices(),
    )
    priced = None if price.cost_usd is None else price.cost_usd.quantize(_COST_PLACES)
    batch.usages.append(
        Usage(
            run=run,
            event_id=str(event["event_id"]),
            epoch=epoch,
            step_key=step_key,
            model=model,
            provider=provider,
            cost_usd=priced,
            price_source=price.source,
            price_version=price.version,
            at=now,
            **counts,
        )
    )
    run.input_tokens += counts["input_tokens"]
    run.output_tokens += counts["output_tokens"]
    fields = ["input_tokens", "output_tokens"]
    if priced is None:
        run.unpriced_tokens += counts["input_tokens"] + counts["output_tokens"]
        fields.append("unpriced_tokens")
    else:
        run.cost_usd += priced
        batch.cost_usd += priced
        fields.append("cost_usd")
    batch.run_fields.update(fields)
    batch.spent = True


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
    "usage": _on_usage,
}


def _finish_locked(
    run: Run, to: str, *, actor: Actor, now: datetime, result: Any = None, failure: Any = None
) -> None:
    lease = live_lease(run)
    if lease is not None:
        release_lease(lease, reason=LeaseReleaseReason.RELEASED, now=now)
    run.finished_at = now
    fields = ["finished_at"]
    if to == RunStatus.COMPLETED:
        run.result = result
        fields.append("result")
    else:
        run.failure = failure
        fields.append("failure")
    run_move(run, to, actor=actor, action=f"run.{to}", fields=tuple(fields))
