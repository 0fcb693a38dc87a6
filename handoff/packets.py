"""The stop packet (DESIGN §4): one immutable snapshot per stop epoch."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, Q, QuerySet, Sum

from handoff.models import StopPacket
from runs import frozen, sql
from runs.models import (
    OUTBOX_IN_FLIGHT_STATUSES,
    Approval,
    ApprovalStatus,
    Artifact,
    ExecutionRecord,
    Lease,
    OutboxItem,
    OutboxStatus,
    Run,
    SideEffect,
    SideEffectState,
    SteeringMessage,
    SteeringStatus,
    Step,
    StepStatus,
    StopReason,
    StopRequest,
    Usage,
    is_unconfirmed_side_effect,
)
from runs.selectors import run_dirty_reasons
from runs.services.budget import (
    TEAM_BUDGET_NAMES,
    budget_from_note,
    budget_limit_from_note,
    exhausted_budget,
)
from runs.sql import OnceCompiled


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def stop_packet_build(
    *, run: Run, stop_request: StopRequest, after: sql.Deferred | None = None
) -> StopPacket:
    """Build the packet once for this epoch; a second call returns the first, unchanged.

    Called inside the settling transaction with the run row locked, so the snapshot is exactly
    the state the stop ended in. `after`: the settle's writes held back, sent first in the
    round trip of the packet's reads (which read what they wrote).
    """
    # The look for an existing packet and the packet's reads go in one round trip: a second
    # call is rare (a retried settle), and the run lock is held while they wait.
    existing, *rows = sql.rows_of_each(
        (_PACKET, (run.pk, run.stop_epoch)), *_stop_packet_reads(run, stop_request), after=after
    )
    if existing:
        return StopPacket.objects.get(pk=existing[0]["pk"])
    packet = StopPacket(
        run=run,
        stop_epoch=run.stop_epoch,
        snapshot=_stop_packet_from(run, stop_request, _PacketRows(*rows)),
    )
    sql.create(packet)  # its INSERT built once, as the reads are compiled once
    return packet


def stop_packet_for_settled_run(
    run: Run, stop_request: StopRequest, writes: sql.Deferred
) -> StopPacket:
    """`runs.hooks` stop_settled: the packet of the stop that just settled."""
    return stop_packet_build(run=run, stop_request=stop_request, after=writes)


# Only the columns the packet keeps are read: the packet is built inside the settling
# transaction with the run row locked, and loading whole rows (each step's `detail` JSON, every
# call's `arguments`) made a 5,000-step stop wait ~400 ms between drained and stopped
# (docs/BENCHMARKS.md). Each list is read and walked once.
_STEP_FIELDS = ("seq", "key", "name", "status", "finished_at", "reported_after_stop")
_OUTBOX_FIELDS = (
    "pk",
    "transport",
    "destination",
    "status",
    "idempotency_key",
    "claimed_at",
    "frozen_at",
)
_ARTIFACT_FIELDS = ("pk", "name", "kind", "uri", "checksum", "reusable", "evidence")
_RECORD_FIELDS = (
    "tool_call_id",
    "tool",
    "operation_id",
    "side_effect",
    "execution_state",
    "side_effect_state",
    "remote_cancel_state",
    "cancel_requested",
    "last_observation",
    "observed_at",
    "observation_source",
    "output_truncated",
    "recovery_policy",
    "recovery_action",
    "idempotency_key",
    "permit_epoch",
    "reported_after_stop",
    "resolved",
)


_LEASE_FIELDS = (
    "token",
    "worker_id",
    "epoch",
    "release_reason",
    "released_at",
    "fenced_unconfirmed",
)
_APPROVAL_FIELDS = (
    "pk",
    "target",
    "execution_record__tool_call_id",
    "outbox_item_id",
    "subject",
    "summary",
    "risk",
    "rule_name",
    "arguments",
    "agent",
    "requested_at",
    "escalated_at",
    "decided_at",
    "decided_by",
)

# Each packet read is compiled once per process (`runs.sql.OnceCompiled`): compiling them again
# on every stop was most of the CPU time of a worker's drained answer (docs/BENCHMARKS.md). The
# samples stand for a run id, an epoch and a time while the statements compile.
_SAMPLE_RUN = "run_sample_5afe"
_SAMPLE_EPOCH = 2_000_000_017
_SAMPLE_AT = datetime(1901, 2, 3, 4, 5, 6, 789_012, tzinfo=UTC)


def _packet_query(run_id: str, epoch: int) -> QuerySet[Any]:
    return StopPacket.objects.filter(run_id=run_id, stop_epoch=epoch).values("pk")[:1]


def _steps_query(run_id: str) -> QuerySet[Any]:
    return Step.objects.filter(run_id=run_id).order_by("seq").values(*_STEP_FIELDS)


def _outbox_query(run_id: str) -> QuerySet[Any]:
    return (
        OutboxItem.objects.filter(run_id=run_id)
        .order_by("id")
        .values(*_OUTBOX_FIELDS, "frozen_by_epoch", "enqueue_epoch")
    )


def _calls_query(run_id: str) -> QuerySet[Any]:
    return (
        ExecutionRecord.objects.filter(run_id=run_id)
        .order_by("permitted_at", "id")
        .values(*_RECORD_FIELDS)
    )


def _leases_query(run_id: str, epoch: int) -> QuerySet[Any]:
    return Lease.objects.filter(run_id=run_id, epoch=epoch).values(*_LEASE_FIELDS)


def _artifacts_query(run_id: str) -> QuerySet[Any]:
    return Artifact.objects.filter(run_id=run_id).order_by("id").values(*_ARTIFACT_FIELDS)


def _steering_query(run_id: str) -> QuerySet[Any]:
    return SteeringMessage.objects.filter(
        run_id=run_id, status=SteeringStatus.UNAPPLIED_AT_STOP
    ).values("pk", "text", "author")


def _approvals_query(run_id: str, epoch: int) -> QuerySet[Any]:
    return (
        Approval.objects.filter(run_id=run_id, epoch=epoch, status=ApprovalStatus.VOID)
        .order_by("requested_at", "id")
        .values(*_APPROVAL_FIELDS)
    )


def _usage_query(run_id: str, stopped_at: datetime) -> QuerySet[Any]:
    """Per model, what it spent in all and before and after `stopped_at` (the stop request)."""
    tokens = F("input_tokens") + F("output_tokens")
    late = Q(at__gt=stopped_at)
    unpriced = Q(cost_usd__isnull=True)
    return (
        Usage.objects.filter(run_id=run_id)
        .values("model")
        .annotate(
            calls=Count("pk"),
            cost=Sum("cost_usd"),
            input=Sum("input_tokens"),
            output=Sum("output_tokens"),
            unpriced=Sum(tokens, filter=unpriced),
            early_cost=Sum("cost_usd", filter=~late),
            early_tokens=Sum(tokens, filter=~late),
            early_unpriced=Sum(tokens, filter=~late & unpriced),
            late_cost=Sum("cost_usd", filter=late),
            late_tokens=Sum(tokens, filter=late),
            late_unpriced=Sum(tokens, filter=late & unpriced),
        )
        .order_by("model")
    )


_PACKET = OnceCompiled(_packet_query, _SAMPLE_RUN, _SAMPLE_EPOCH)
_STEPS = OnceCompiled(_steps_query, _SAMPLE_RUN)
_OUTBOX = OnceCompiled(_outbox_query, _SAMPLE_RUN)
_CALLS = OnceCompiled(_calls_query, _SAMPLE_RUN)
_LEASES = OnceCompiled(_leases_query, _SAMPLE_RUN, _SAMPLE_EPOCH)
_ARTIFACTS = OnceCompiled(_artifacts_query, _SAMPLE_RUN)
_STEERING = OnceCompiled(_steering_query, _SAMPLE_RUN)
_APPROVALS = OnceCompiled(_approvals_query, _SAMPLE_RUN, _SAMPLE_EPOCH)
_USAGE = OnceCompiled(_usage_query, _SAMPLE_RUN, _SAMPLE_AT)


@dataclass(frozen=True)
class _PacketRows:
    """What a stop packet reads, in `_stop_packet_reads`' order."""

    steps: list[dict[str, Any]]
    outbox: list[dict[str, Any]]
    calls: list[dict[str, Any]]
    leases: list[dict[str, Any]]
    artifacts: list[dict[str, Any]]
    steering: list[dict[str, Any]]
    approvals: list[dict[str, Any]]
    usage: list[dict[str, Any]]


def _stop_packet_reads(
    run: Run, stop_request: StopRequest
) -> list[tuple[OnceCompiled, tuple[Any, ...]]]:
    return [
        (_STEPS, (run.pk,)),
        (_OUTBOX, (run.pk,)),
        (_CALLS, (run.pk,)),
        (_LEASES, (run.pk, stop_request.epoch_before)),
        (_ARTIFACTS, (run.pk,)),
        (_STEERING, (run.pk,)),
        # DESIGN §10: held at the stop, voided by it, never executed.
        (_APPROVALS, (run.pk, stop_request.epoch_before)),
        (_USAGE, (run.pk, stop_request.requested_at)),
    ]


def stop_packet_snapshot(run: Run, stop_request: StopRequest) -> dict[str, Any]:
    rows = _PacketRows(*sql.rows_of_each(*_stop_packet_reads(run, stop_request)))
    return _stop_packet_from(run, stop_request, rows)


def _stop_packet_from(run: Run, stop_request: StopRequest, rows: _PacketRows) -> dict[str, Any]:
    steps = _steps_part(rows.steps)
    outbox = _outbox_part(run, rows.outbox)
    calls = _calls_part(rows.calls)
    return {
        "run_id": run.pk,
        "title": run.title,
        "agent": run.agent,
        "team": run.team.slug,
        "stop_epoch": run.stop_epoch,
        "stop_reason": run.stop_reason,
        "stop_note": stop_request.note,
        "takeover": stop_request.takeover,
        "requested_by": stop_request.requested_by,
        "requested_at": _iso(stop_request.requested_at),
        "acknowledged_at": _iso(stop_request.acknowledged_at),
        "drained_at": _iso(stop_request.drained_at),
        "stopped_at": _iso(stop_request.stopped_at),
        "state": run.status,
        "dirty_reasons": list(stop_request.dirty_reasons),
        **_leases_part(rows.leases),
        "resume_from": run.resume_from or None,
        **outbox,
        **steps,
        "artifacts": _artifacts_part(rows.artifacts),
        **calls,
        "unapplied_steering": [
            {"id": message["pk"], "text": message["text"], "author": message["author"]}
            for message in rows.steering
        ],
        # DESIGN §10: held at the stop, voided by it, never executed.
        "approvals_void_at_stop": _approvals_void(rows.approvals),
        "reported_after_stop": list(run.late_reports),
        "late_writes_rejected": run.late_writes_rejected,
        "cost": _cost_part(run, stop_request, rows.usage),
    }


def _usd(value: Decimal | None) -> float:
    return float(value or 0)


def _cost_part(run: Run, stop_request: StopRequest, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run spent up to the stop request, and what was reported after it (late spend:
    calls already under way, or a worker that kept going). Unpriced tokens are counted apart:
    their cost is unknown, not 0. `budget` names the budget that stopped the run, if one did."""
    # The totals add the per-model sums: exact (numeric and integers), None when no row has one.
    totals = {
        name: _sum(row[name] for row in rows)
        for name in (
            "early_cost",
            "early_tokens",
            "early_unpriced",
            "late_cost",
            "late_tokens",
            "late_unpriced",
        )
    }
    by_model = [
        {
            "model": row["model"],
            "calls": row["calls"],
            "cost_usd": _usd(row["cost"]),
            "input_tokens": row["input"],
            "output_tokens": row["output"],
            "unpriced_tokens": row["unpriced"] or 0,
        }
        for row in rows
    ]
    budget = ""
    if run.stop_reason == StopReason.BUDGET_EXHAUSTED:
        budget = budget_from_note(stop_request.note) or exhausted_budget(run)
    return {
        "cost_usd_until_stop": _usd(totals["early_cost"]),
        "tokens_until_stop": totals["early_tokens"] or 0,
        "unpriced_tokens_until_stop": totals["early_unpriced"] or 0,
        "late_cost_usd": _usd(totals["late_cost"]),
        "late_tokens": totals["late_tokens"] or 0,
        "late_unpriced_tokens": totals["late_unpriced"] or 0,
        "by_model": by_model,
        "budget": _budget_part(run, budget, stop_request.note) if budget else None,
    }


def _sum(values: Any) -> Any:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def _budget_part(run: Run, budget: str, note: str) -> dict[str, Any]:
    if budget in TEAM_BUDGET_NAMES:  # the team's limit when it stopped the run, from the note
        limit: Any = budget_limit_from_note(note)
        return {"name": budget, "limit": None if limit is None else float(limit), "note": note}
    limit = getattr(run, budget)
    return {"name": budget, "limit": float(limit) if isinstance(limit, Decimal) else limit}


def interruption_packet(run: Run) -> dict[str, Any]:
    """An interrupted run's packet: the interruption point and the stop packet's lists, read now.

    Not stored: an interruption bumps no epoch and is not a stop, so there is no stop packet
    for it; the run itself keeps the point (`run.interruption`). The unknowns are the ones the
    interruption left — the writes among the calls it marked `unknown`, the outbox items it
    found in flight — and any still open, each in its current state, so a reviewer sees what
    is resolved and what is not. The lists have the stop packet's shape (DESIGN §4).
    """
    point = dict(run.interruption or {})
    steps = _steps_part(_STEPS.rows(run.pk))
    outbox = _outbox_part(run, _OUTBOX.rows(run.pk), frozen_by_epoch=run.stop_epoch)
    marked = set(point.get("calls_in_flight", []))
    calls = _calls_part(_CALLS.rows(run.pk), also=marked)
    in_flight = list(
        dict.fromkeys([*point.get("outbox_in_flight", []), *outbox["in_flight_outbox_ids"]])
    )
    leases = _LEASES.rows(run.pk, run.stop_epoch)
    return {
        "kind": "interruption",
        "run_id": run.pk,
        "title": run.title,
        "agent": run.agent,
        "team": run.team.slug,
        "stop_epoch": run.stop_epoch,
        "state": run.status,
        "interruption": point,
        "interrupted_at": point.get("at"),
        "interruption_reason": point.get("reason", ""),
        "dirty_reasons": run_dirty_reasons(run),
        **_leases_part(leases),
        "resume_from": run.resume_from or None,
        **outbox,
        "in_flight_outbox_ids": in_flight,
        **steps,
        "artifacts": _artifacts_part(_ARTIFACTS.rows(run.pk)),
        **calls,
        "late_writes_rejected": run.late_writes_rejected,
        # An interruption bumps no epoch: what it voided carries the run's current one.
        "approvals_void_at_interruption": _approvals_void(_APPROVALS.rows(run.pk, run.stop_epoch)),
    }


def _steps_part(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    completed_steps: list[dict[str, Any]] = []
    pending_steps: list[dict[str, Any]] = []
    for row in rows:
        seq, key, name, status, finished_at, late = (row[field] for field in _STEP_FIELDS)
        if status == StepStatus.COMPLETED:
            completed_steps.append(
                {
                    "seq": seq,
                    "key": key,
                    "name": name,
                    "finished_at": _iso(finished_at),
                    "reported_after_stop": late,
                }
            )
        else:
            pending_steps.append({"seq": seq, "key": key, "name": name, "status": status})
    return {"completed_steps": completed_steps, "pending_steps": pending_steps}


def _outbox_part(
    run: Run, read: list[dict[str, Any]], *, frozen_by_epoch: int | None = None
) -> dict[str, Any]:
    """The outbox lists. `frozen_ids` are the items frozen now, or with `frozen_by_epoch`, every
    item that epoch froze whatever became of it (an interruption's: released ones stay listed).
    An item the stop's epoch froze whose row is not relabelled yet is listed as the relabel will
    write it (`runs.frozen`)."""
    frozen_ids: list[str] = []
    in_flight_ids: list[str] = []
    outbox: list[dict[str, Any]] = []
    rows = [tuple(row.values()) for row in read]
    stale = [row[-1] for row in rows if row[3] == OutboxStatus.PENDING and row[-1] < run.stop_epoch]
    stops = frozen.freezing_stops(run, above_epoch=min(stale)) if stale else []
    for row in rows:
        pk, transport, destination, status, idempotency_key, claimed_at, frozen_at, epoch, at = row
        if status == OutboxStatus.PENDING and at < run.stop_epoch:
            status = OutboxStatus.FROZEN
            epoch, frozen_at = frozen.freezing_stop(stops, run, at)
        public_id = f"outbox_{pk}"  # OutboxItem.public_id
        if frozen_by_epoch is None and status == OutboxStatus.FROZEN:
            frozen_ids.append(public_id)
        elif frozen_by_epoch is not None and frozen_at and epoch == frozen_by_epoch:
            frozen_ids.append(public_id)
        elif status in OUTBOX_IN_FLIGHT_STATUSES:
            in_flight_ids.append(public_id)
        outbox.append(
            {
                "id": public_id,
                "transport": transport,
                "destination": destination,
                "status": status,
                "idempotency_key": idempotency_key,
                "claimed_at": _iso(claimed_at),
                "frozen_at": _iso(frozen_at),
            }
        )
    return {
        "frozen_outbox_ids": frozen_ids,
        "in_flight_outbox_ids": in_flight_ids,
        "outbox": outbox,
    }


def _calls_part(
    rows: list[dict[str, Any]], *, also: set[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Every call, and the unconfirmed writes; `also` names calls whose writes are listed there
    even once resolved or settled by a late fact (an interruption's: the calls it marked unknown)."""
    tool_calls: list[dict[str, Any]] = []
    unconfirmed: list[dict[str, Any]] = []
    for record in rows:
        summary = _record_summary(record)
        tool_calls.append(summary)
        if is_unconfirmed_side_effect(
            side_effect=record["side_effect"],
            side_effect_state=record["side_effect_state"],
            resolved=record["resolved"],
        ):
            unconfirmed.append(dict(summary))
        elif also and record["tool_call_id"] in also and record["side_effect"] == SideEffect.WRITE:
            # Settled since: the advice stays what it was while the outcome was unknown (it is
            # what the reviewer acted on), not the blank a settled call would get.
            marked = dict(summary)
            if not record["recovery_action"]:
                unknown = {**record, "side_effect_state": SideEffectState.PENDING_VERIFICATION}
                marked["recovery_action"] = _default_recovery_action(unknown)
            unconfirmed.append(marked)
    return {"tool_calls": tool_calls, "unconfirmed_side_effects": unconfirmed}


def _leases_part(leases: list[dict[str, Any]]) -> dict[str, Any]:
    """`leases`: the _LEASE_FIELDS of each Lease."""
    return {
        "lease_released": all(
            lease["released_at"] is not None and not lease["fenced_unconfirmed"] for lease in leases
        ),
        "leases": [
            {
                "lease_id": lease["token"],
                "worker_id": lease["worker_id"],
                "epoch": lease["epoch"],
                "release_reason": lease["release_reason"],
                "released_at": _iso(lease["released_at"]),
                "fenced_unconfirmed": lease["fenced_unconfirmed"],
            }
            for lease in leases
        ],
    }


def _artifacts_part(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "id": pk,
            "name": name,
            "kind": kind,
            "uri": uri,
            "checksum": checksum,
            "reusable": reusable,
            "evidence": evidence,
        }
        for pk, name, kind, uri, checksum, reusable, evidence in (
            tuple(row.values()) for row in rows
        )
    ]


def _approvals_void(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The approvals a stop or an interruption voided (`_APPROVALS` at its epoch): calls and items that were
    waiting for a reviewer and will never run. A reviewer reading the packet must see them,
    or a held payment silently disappears from the story of the run."""
    return [
        {
            "id": f"appr_{approval['pk']}",  # Approval.public_id
            "target": approval["target"],
            "tool_call_id": approval["execution_record__tool_call_id"],
            "outbox_id": (
                f"outbox_{approval['outbox_item_id']}"  # OutboxItem.public_id
                if approval["outbox_item_id"]
                else None
            ),
            "tool": approval["subject"],
            "summary": approval["summary"],
            "risk": approval["risk"],
            "rule": approval["rule_name"] or None,
            "arguments": approval["arguments"],
            "agent": approval["agent"],
            "requested_at": _iso(approval["requested_at"]),
            "escalated_at": _iso(approval["escalated_at"]),
            "voided_at": _iso(approval["decided_at"]),
            "voided_by": approval["decided_by"] or None,
            "executed": False,
        }
        for approval in rows
    ]


def _record_summary(record: dict[str, Any]) -> dict[str, Any]:
    """One call as the packet shows it; `record` holds the _RECORD_FIELDS of an ExecutionRecord."""
    return {
        "tool_call_id": record["tool_call_id"],
        "tool": record["tool"],
        "operation_id": record["operation_id"] or None,
        "side_effect": record["side_effect"],
        "execution_state": record["execution_state"],
        "side_effect_state": record["side_effect_state"],
        "remote_cancel_state": record["remote_cancel_state"],
        "cancel_requested": record["cancel_requested"],
        "last_observation": record["last_observation"],
        "last_observed_at": _iso(record["observed_at"]),
        "observation_source": record["observation_source"],
        "output_truncated": record["output_truncated"],
        "recovery_policy": record["recovery_policy"],
        "recovery_action": record["recovery_action"] or _default_recovery_action(record),
        "idempotency_key": record["idempotency_key"] or None,
        "permit_epoch": record["permit_epoch"],
        "reported_after_stop": record["reported_after_stop"],
    }


def _default_recovery_action(record: dict[str, Any]) -> str:
    """Say what to do when the agent did not: never 'retry' for an unknown write."""
    if (
        record["side_effect"] != SideEffect.WRITE
        or record["side_effect_state"] != SideEffectState.PENDING_VERIFICATION
    ):
        return ""
    target = record["operation_id"] or record["tool_call_id"]
    policy = record["recovery_policy"]
    if policy == "query_original":
        return f"query {target}; do not re-run {record['tool']}"
    if policy == "reuse_idempotency_key" and record["idempotency_key"]:
        return f"retry only with idempotency key {record['idempotency_key']}"
    if policy == "compensate":
        return f"verify {target}, then compensate if it was applied"
    return f"confirm manually whether {record['tool']} ({target}) took effect"
