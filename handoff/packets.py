"""The stop packet (DESIGN §4): one immutable snapshot per stop epoch."""

from __future__ import annotations

from typing import Any

from handoff.models import StopPacket
from runs.models import (
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
    StopRequest,
)


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def stop_packet_build(*, run: Run, stop_request: StopRequest) -> StopPacket:
    """Build the packet once for this epoch; a second call returns the first, unchanged.

    Called inside the settling transaction with the run row locked, so the snapshot is exactly
    the state the stop ended in.
    """
    existing = StopPacket.objects.filter(run=run, stop_epoch=run.stop_epoch).first()
    if existing is not None:
        return existing
    return StopPacket.objects.create(run=run, stop_epoch=run.stop_epoch, snapshot=stop_packet_snapshot(run, stop_request))


def stop_packet_snapshot(run: Run, stop_request: StopRequest) -> dict[str, Any]:
    steps = list(Step.objects.filter(run=run).order_by("seq"))
    outbox = list(OutboxItem.objects.filter(run=run).order_by("id"))
    records = list(ExecutionRecord.objects.filter(run=run).order_by("permitted_at", "id"))
    leases = list(Lease.objects.filter(run=run, epoch=stop_request.epoch_before))
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
        "lease_released": all(lease.released_at is not None and not lease.fenced_unconfirmed for lease in leases),
        "leases": [
            {"lease_id": lease.token, "worker_id": lease.worker_id, "epoch": lease.epoch,
             "release_reason": lease.release_reason, "released_at": _iso(lease.released_at),
             "fenced_unconfirmed": lease.fenced_unconfirmed}
            for lease in leases
        ],
        "resume_from": run.resume_from or None,
        "frozen_outbox_ids": [item.public_id for item in outbox if item.status == OutboxStatus.FROZEN],
        "in_flight_outbox_ids": [
            item.public_id for item in outbox if item.status in (OutboxStatus.DISPATCHING, OutboxStatus.UNKNOWN)
        ],
        "outbox": [
            {"id": item.public_id, "transport": item.transport, "destination": item.destination,
             "status": item.status, "idempotency_key": item.idempotency_key, "claimed_at": _iso(item.claimed_at),
             "frozen_at": _iso(item.frozen_at)}
            for item in outbox
        ],
        "completed_steps": [
            {"seq": step.seq, "key": step.key, "name": step.name, "finished_at": _iso(step.finished_at),
             "reported_after_stop": step.reported_after_stop}
            for step in steps if step.status == StepStatus.COMPLETED
        ],
        "pending_steps": [
            {"seq": step.seq, "key": step.key, "name": step.name, "status": step.status}
            for step in steps if step.status != StepStatus.COMPLETED
        ],
        "artifacts": [
            {"id": artifact.pk, "name": artifact.name, "kind": artifact.kind, "uri": artifact.uri,
             "checksum": artifact.checksum, "reusable": artifact.reusable, "evidence": artifact.evidence}
            for artifact in Artifact.objects.filter(run=run).order_by("id")
        ],
        "tool_calls": [_record_summary(record) for record in records],
        "unconfirmed_side_effects": [
            _record_summary(record) for record in records
            if record.side_effect == SideEffect.WRITE and record.side_effect_state == SideEffectState.PENDING_VERIFICATION
            and not record.resolved
        ],
        "unapplied_steering": [
            {"id": message.pk, "text": message.text, "author": message.author}
            for message in SteeringMessage.objects.filter(run=run, status=SteeringStatus.UNAPPLIED_AT_STOP)
        ],
        "reported_after_stop": list(run.late_reports),
        "late_writes_rejected": run.late_writes_rejected,
    }


def _record_summary(record: ExecutionRecord) -> dict[str, Any]:
    return {
        "tool_call_id": record.tool_call_id,
        "tool": record.tool,
        "operation_id": record.operation_id or None,
        "side_effect": record.side_effect,
        "execution_state": record.execution_state,
        "side_effect_state": record.side_effect_state,
        "remote_cancel_state": record.remote_cancel_state,
        "cancel_requested": record.cancel_requested,
        "last_observation": record.last_observation,
        "last_observed_at": _iso(record.observed_at),
        "observation_source": record.observation_source,
        "output_truncated": record.output_truncated,
        "recovery_policy": record.recovery_policy,
        "recovery_action": record.recovery_action or _default_recovery_action(record),
        "idempotency_key": record.idempotency_key or None,
        "permit_epoch": record.permit_epoch,
        "reported_after_stop": record.reported_after_stop,
    }


def _default_recovery_action(record: ExecutionRecord) -> str:
    """Say what to do when the agent did not: never 'retry' for an unknown write."""
    if record.side_effect != SideEffect.WRITE or record.side_effect_state != SideEffectState.PENDING_VERIFICATION:
        return ""
    target = record.operation_id or record.tool_call_id
    policy = record.recovery_policy
    if policy == "query_original":
        return f"query {target}; do not re-run {record.tool}"
    if policy == "reuse_idempotency_key" and record.idempotency_key:
        return f"retry only with idempotency key {record.idempotency_key}"
    if policy == "compensate":
        return f"verify {target}, then compensate if it was applied"
    return f"confirm manually whether {record.tool} ({target}) took effect"
