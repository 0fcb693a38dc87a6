"""Approval gates (DESIGN §10): a tool call or an outbox item held until a reviewer decides.

Requesting, deciding, expiring and voiding all lock the run row first, like a permit and a
stop, so each of them is ordered against the stop: an approval decided before the stop's commit
permits work at the old epoch (which the stop then finds as in-flight work); one decided after
it finds the approval already void. A decision is taken once.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs import notify
from runs.actors import Actor
from runs.argument_schemas import arguments_schema_check, edited_arguments_check
from runs.errors import (
    AlreadyDecided,
    ApprovalClosed,
    ApprovalRateLimited,
    ApprovalVoid,
    InvalidInput,
    NotFound,
    RunNotRunning,
)
from runs.ledger import ledger_append
from runs.models import (
    Approval,
    ApprovalAppliesTo,
    ApprovalRisk,
    ApprovalRule,
    ApprovalStatus,
    ApprovalTarget,
    ExecutionRecord,
    ExecutionState,
    OutboxItem,
    OutboxStatus,
    Run,
    RunStatus,
    SideEffect,
    SideEffectState,
)
from runs.services._base import _changed as changed
from runs.services._base import locked_run

DECISIONS = ("approve", "reject")


@dataclass(frozen=True)
class GateAnswer:
    """Why a call waits: the rule that matched (None when the agent asked) and in words."""

    rule: ApprovalRule | None
    reason: str
    # What the approval names as its rule when no approval rule held it (a policy's name).
    name: str = ""


# --------------------------------------------------------------------------------------------
# rules


def approval_rule_validate_glob(value: str, *, field: str) -> str:
    """A glob is fnmatch syntax; an unbalanced '[' would silently match nothing, so refuse it."""
    value = value.strip()
    depth = 0
    for char in value:
        if char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
    if depth:
        raise InvalidInput(f"{field}: unbalanced '[' in glob {value!r}", field=field)
    if "\x00" in value:
        raise InvalidInput(f"{field}: a glob cannot contain NUL", field=field)
    return value


def _glob(pattern: str, value: str) -> bool:
    return not pattern or fnmatch.fnmatchcase(value, pattern)


def _rule_matches_call(rule: ApprovalRule, *, agent: str, tool: str, side_effect: str) -> bool:
    return (
        rule.applies_to in (ApprovalAppliesTo.ANY, ApprovalAppliesTo.TOOL_CALL)
        and _glob(rule.agent_glob, agent)
        and _glob(rule.tool_glob, tool)
        and (not rule.side_effect or rule.side_effect == side_effect)
        and not rule.transport
        and not rule.destination_glob
    )


def _rule_matches_item(rule: ApprovalRule, *, agent: str, transport: str, destination: str) -> bool:
    return (
        rule.applies_to in (ApprovalAppliesTo.ANY, ApprovalAppliesTo.OUTBOX)
        and _glob(rule.agent_glob, agent)
        and (not rule.transport or rule.transport == transport)
        and _glob(rule.destination_glob, destination)
        and not rule.tool_glob
        and rule.side_effect != SideEffect.NONE
    )


def _describe(rule: ApprovalRule) -> str:
    parts = [
        f"{label} {value!r}"
        for label, value in (
            ("tool", rule.tool_glob),
            ("side effect", rule.side_effect),
            ("agent", rule.agent_glob),
            ("transport", rule.transport),
            ("destination", rule.destination_glob),
        )
        if value
    ]
    return f"rule {rule.name!r} matched " + (", ".join(parts) if parts else "everything")


def _team_rules(team_id: int) -> list[ApprovalRule]:
    return list(
        ApprovalRule.objects.filter(team_id=team_id, enabled=True).order_by("position", "id")
    )


def gate_for_call(
    run: Run, *, tool: str, side_effect: str, needs_approval: bool, rules_exist: bool = True
) -> GateAnswer | None:
    """The first matching rule decides; an agent's own `needs_approval` holds the call too.

    `rules_exist=False`: the caller has just read that the team has no enabled rule."""
    for rule in _team_rules(run.team_id) if rules_exist else []:
        if _rule_matches_call(rule, agent=run.agent, tool=tool, side_effect=side_effect):
            return GateAnswer(rule, _describe(rule))
    return GateAnswer(None, "asked by the agent") if needs_approval else None


def gate_for_item(
    run: Run, *, transport: str, destination: str, needs_approval: bool
) -> GateAnswer | None:
    for rule in _team_rules(run.team_id):
        if _rule_matches_item(rule, agent=run.agent, transport=transport, destination=destination):
            return GateAnswer(rule, _describe(rule))
    return GateAnswer(None, "asked by the agent") if needs_approval else None


def validate_arguments_schema(schema: Any) -> dict[str, Any] | None:
    """An agent's JSON Schema for edits must be one that can be checked safely later: a valid
    2020-12 schema, bounded, with local references only and no reference loop (400 with a
    `schema_*` code otherwise; see `runs.argument_schemas`). Call it before any lock."""
    return arguments_schema_check(schema)


def validate_risk(risk: str) -> str:
    if risk and risk not in ApprovalRisk.values:
        raise InvalidInput(f"risk must be one of {', '.join(ApprovalRisk.values)}", field="risk")
    return risk


def refuse_if_approval_closed(held: ExecutionRecord | OutboxItem, run: Run) -> None:
    """A call or item asked for again after its approval ended without approval: say so, with
    the reviewer's message, rather than answer as if it could still run."""
    approval = Approval.objects.filter(
        **{"execution_record" if isinstance(held, ExecutionRecord) else "outbox_item": held}
    ).first()
    if approval is None or approval.status in (ApprovalStatus.WAITING, ApprovalStatus.APPROVED):
        return
    raise ApprovalClosed(
        f"{approval.public_id} was {approval.status}"
        + (f": {approval.message}" if approval.message else ""),
        status=run.status,
        stop_epoch=run.stop_epoch,
        approval_id=approval.public_id,
        approval_status=approval.status,
        message=approval.message,
    )


# --------------------------------------------------------------------------------------------
# request (called by permit_request and outbox_enqueue, under their run lock)


APPROVAL_RATE_WINDOW = timedelta(minutes=1)


def _check_team_approval_rate(team_id: int, *, now: datetime) -> None:
    """Refuse a team's approval request past `SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE` in a
    sliding minute: one agent flooding approvals would otherwise bury its team's reviewers and
    queue thousands of notifications. One query reads the limit-th newest request of the team
    (`approval_team_requested_idx`, at most `limit` index entries): if it is inside the window,
    the limit is reached, and the answer says when the oldest of them leaves it. Requests of
    other runs of the team may commit in parallel, so the bound can be passed by the number of
    concurrent requests — a rate, not a quota."""
    limit = settings.SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE
    if limit <= 0:
        return
    window_start = now - APPROVAL_RATE_WINDOW
    counted = list(
        Approval.objects.filter(team_id=team_id, requested_at__gt=window_start)
        .order_by("-requested_at")
        .values_list("requested_at", flat=True)[limit - 1 : limit]
    )
    if not counted:
        return
    oldest_counted = counted[0]
    retry_after = (oldest_counted - window_start).total_seconds()
    raise ApprovalRateLimited(
        f"the team asked for {limit} approvals in the last minute, the most "
        "SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE allows; nothing was held or written. Retry after "
        f"{max(1, int(retry_after + 0.999))} s, or ask a team admin about the rules that hold "
        "these calls",
        retry_after=retry_after,
        limit=limit,
    )


def approval_request_locked(
    run: Run,
    *,
    gate: GateAnswer,
    actor: Actor,
    now: datetime,
    record: ExecutionRecord | None = None,
    item: OutboxItem | None = None,
    summary: str = "",
    risk: str = "",
    arguments_schema: dict[str, Any] | None = None,
) -> Approval:
    _check_team_approval_rate(run.team_id, now=now)
    rule = gate.rule
    timeout = rule.timeout_seconds if rule else settings.SAFESTOP_APPROVAL_TIMEOUT_SECONDS
    escalate_after = rule.escalate_after_seconds if rule else None
    if record is not None:
        target, subject, arguments = ApprovalTarget.TOOL_CALL, record.tool, record.arguments
    else:
        assert item is not None
        target = ApprovalTarget.OUTBOX
        subject = f"{item.transport} → {item.destination}"[:300]
        arguments = item.payload
    approval = Approval.objects.create(
        run=run,
        team_id=run.team_id,
        agent=run.agent,
        epoch=run.stop_epoch,
        target=target,
        execution_record=record,
        outbox_item=item,
        subject=subject,
        rule=rule,
        rule_name=rule.name if rule else gate.name[:120],
        match_reason=gate.reason[:500],
        summary=summary,
        risk=risk or (rule.risk if rule else ApprovalRisk.MEDIUM),
        original_arguments=arguments,
        arguments=arguments,
        arguments_schema=arguments_schema,
        requested_at=now,
        deadline=now + timedelta(seconds=timeout),
        escalate_at=now + timedelta(seconds=escalate_after) if escalate_after else None,
    )
    ledger_append(
        run=run,
        actor=actor,
        action="approval.requested",
        reason=approval.rule_name or "asked_by_agent",
        payload={
            "approval_id": approval.public_id,
            "target": target,
            "subject": subject,
            "risk": approval.risk,
            "deadline": approval.deadline.isoformat(),
            "why": approval.match_reason,
            **_target_ids(approval),
        },
    )
    changed(run, kind="approval.requested")
    return approval


def _target_ids(approval: Approval) -> dict[str, Any]:
    if approval.target == ApprovalTarget.TOOL_CALL:
        assert approval.execution_record is not None
        return {"tool_call_id": approval.execution_record.tool_call_id}
    assert approval.outbox_item is not None
    return {"outbox_id": approval.outbox_item.public_id}


# --------------------------------------------------------------------------------------------
# decide, expire, escalate


def parse_approval_id(value: str | int) -> int:
    text = str(value)
    text = text.removeprefix("appr_")
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise NotFound(f"approval {value} does not exist")
    return int(text)


def _run_id_of(approval_id: int) -> str:
    run_id = Approval.objects.filter(pk=approval_id).values_list("run_id", flat=True).first()
    if run_id is None:
        raise NotFound(f"approval appr_{approval_id} does not exist")
    return run_id


def _lock_approval(approval_id: int) -> Approval:
    return (
        Approval.objects.select_for_update(of=("self",))
        .select_related("execution_record", "outbox_item")
        .get(pk=approval_id)
    )


def _refuse_decided(approval: Approval, run: Run) -> None:
    if approval.status == ApprovalStatus.VOID:
        raise ApprovalVoid(
            f"{approval.public_id} was voided: {approval.message or 'the run stopped'}",
            status=run.status,
            stop_epoch=run.stop_epoch,
            approval_status=approval.status,
        )
    raise AlreadyDecided(
        f"{approval.public_id} was already {approval.status}"
        + (f" by {approval.decided_by}" if approval.decided_by else ""),
        status=run.status,
        stop_epoch=run.stop_epoch,
        approval_status=approval.status,
        decided_by=approval.decided_by,
        decided_at=approval.decided_at.isoformat() if approval.decided_at else None,
    )


def _final_arguments(approval: Approval, arguments: Any) -> tuple[dict[str, Any], bool]:
    """The arguments to approve, and whether they were edited (checked by `_check_edits`)."""
    if arguments is None:
        return approval.arguments, False
    return arguments, arguments != approval.original_arguments


def _check_edits(approval_id: int, arguments: Any) -> None:
    """Edited arguments against the approval's schema: bounded, and before the run lock, so a
    stop never waits behind a reviewer's validation. The schema never changes after the
    request, so a check here holds under the lock too."""
    schema, status = (
        Approval.objects.filter(pk=approval_id).values_list("arguments_schema", "status").get()
    )
    if status == ApprovalStatus.WAITING:  # a decided one is answered 409 under the lock
        edited_arguments_check(schema or None, arguments)


def approval_decide(
    *,
    approval_id: int,
    decision: str,
    actor: Actor,
    message: str = "",
    arguments: Any = None,
) -> Approval:
    """A reviewer approves (as is, or with edited arguments) or rejects a waiting approval.

    0. edited arguments are checked first, without a lock (`_check_edits`); 1. lock the run,
    then the approval; 2. a decided approval answers 409 with the first
    decision (void: `approval_void`); 3. approve only while the run is running at the
    approval's epoch; 4. move the held record or item; 5. ledger + push to the worker on commit.
    """
    if decision not in DECISIONS:
        raise InvalidInput(f"decision must be one of {', '.join(DECISIONS)}", field="decision")
    if not isinstance(message, str):
        raise InvalidInput("message must be text", field="message")
    run_id = _run_id_of(approval_id)
    if decision == "approve" and arguments is not None:
        _check_edits(approval_id, arguments)
    with locked_run(run_id) as run:
        approval = _lock_approval(approval_id)
        if approval.status != ApprovalStatus.WAITING:
            _refuse_decided(approval, run)
        now = timezone.now()
        if decision == "approve":
            open_for_decision = run.status == RunStatus.RUNNING or keeps_approvals(run)
            if not open_for_decision or run.stop_epoch != approval.epoch:
                raise RunNotRunning(
                    f"the run is {run.status} at epoch {run.stop_epoch}; "
                    f"{approval.public_id} belongs to epoch {approval.epoch}",
                    status=run.status,
                    stop_epoch=run.stop_epoch,
                )
            final, edited = _final_arguments(approval, arguments)
            _approve_locked(
                run, approval, final=final, edited=edited, actor=actor, now=now, message=message
            )
        else:
            if arguments is not None:
                raise InvalidInput(
                    "a rejection carries a message, not arguments", field="arguments"
                )
            _close_locked(
                run, approval, ApprovalStatus.REJECTED, actor=actor, now=now, message=message
            )
    return approval


def _stamp(approval: Approval, status: str, *, actor: Actor, now: datetime, message: str) -> None:
    approval.status = status
    approval.decided_by = actor.name
    approval.decided_by_kind = actor.kind
    approval.decided_at = now
    approval.message = message[:4000]


def _approve_locked(
    run: Run,
    approval: Approval,
    *,
    final: dict[str, Any],
    edited: bool,
    actor: Actor,
    now: datetime,
    message: str,
) -> None:
    _stamp(approval, ApprovalStatus.APPROVED, actor=actor, now=now, message=message)
    approval.arguments = final
    approval.edited = edited
    approval.save(
        update_fields=[
            "status",
            "decided_by",
            "decided_by_kind",
            "decided_at",
            "message",
            "arguments",
            "edited",
        ]
    )
    if approval.target == ApprovalTarget.TOOL_CALL:
        record = approval.execution_record
        assert record is not None
        record.execution_state = ExecutionState.PERMITTED
        record.permitted_at = now
        record.arguments = final
        if record.side_effect == SideEffect.WRITE:
            # From here the call may run: a write whose result never arrives is unconfirmed.
            record.side_effect_state = SideEffectState.PENDING_VERIFICATION
        record.save(
            update_fields=["execution_state", "permitted_at", "arguments", "side_effect_state"]
        )
    else:
        item = approval.outbox_item
        assert item is not None
        item.status = OutboxStatus.PENDING
        item.payload = final
        item.save(update_fields=["status", "payload", "updated_at"])
    payload: dict[str, Any] = {
        "approval_id": approval.public_id,
        "edited": edited,
        **_target_ids(approval),
    }
    if edited:
        payload["original_arguments"] = approval.original_arguments
        payload["arguments"] = final
    ledger_append(
        run=run, actor=actor, action="approval.approved", reason=message[:60], payload=payload
    )
    changed(run, kind="approval.approved")
    notify.approval_decided(run, approval)


def _close_locked(
    run: Run, approval: Approval, status: str, *, actor: Actor, now: datetime, message: str
) -> None:
    """Rejected or expired: the call never runs (not_started), the item is discarded."""
    _stamp(approval, status, actor=actor, now=now, message=message)
    approval.save(
        update_fields=["status", "decided_by", "decided_by_kind", "decided_at", "message"]
    )
    if approval.target == ApprovalTarget.TOOL_CALL:
        _never_ran(approval.execution_record, now=now, why=f"approval {status}")
    else:
        item = approval.outbox_item
        assert item is not None
        item.status = OutboxStatus.DISCARDED
        item.last_error = f"approval {status}: {message}"[:1000]
        item.save(update_fields=["status", "last_error", "updated_at"])
    ledger_append(
        run=run,
        actor=actor,
        action=f"approval.{status}",
        reason=message[:60],
        payload={"approval_id": approval.public_id, "message": message, **_target_ids(approval)},
    )
    changed(run, kind=f"approval.{status}")
    notify.approval_decided(run, approval)


def _never_ran(record: ExecutionRecord | None, *, now: datetime, why: str) -> None:
    assert record is not None
    record.execution_state = ExecutionState.NOT_STARTED
    record.side_effect_state = (
        SideEffectState.NOT_APPLIED
        if record.side_effect == SideEffect.WRITE
        else SideEffectState.NONE
    )
    record.last_observation = why
    record.observed_at = now
    record.observation_source = "approval"
    record.finished_at = now
    record.save(
        update_fields=[
            "execution_state",
            "side_effect_state",
            "last_observation",
            "observed_at",
            "observation_source",
            "finished_at",
        ]
    )


def approval_expire(*, approval_id: int, now: datetime | None = None) -> bool:
    """Deny by default: a waiting approval past its deadline is expired, as a rejection."""
    with locked_run(_run_id_of(approval_id)) as run:
        approval = _lock_approval(approval_id)
        now = now or timezone.now()
        if approval.status != ApprovalStatus.WAITING or approval.deadline > now:
            return False
        _close_locked(
            run,
            approval,
            ApprovalStatus.EXPIRED,
            actor=Actor.system("approval-deadline"),
            now=now,
            message="no reviewer decided before the deadline",
        )
    return True


def approval_escalate(*, approval_id: int, now: datetime | None = None) -> bool:
    """Mark a still-waiting approval escalated; the ledger entry is what notifications deliver."""
    with locked_run(_run_id_of(approval_id)) as run:
        approval = _lock_approval(approval_id)
        now = now or timezone.now()
        if (
            approval.status != ApprovalStatus.WAITING
            or approval.escalated_at is not None
            or approval.escalate_at is None
            or approval.escalate_at > now
        ):
            return False
        approval.escalated_at = now
        approval.save(update_fields=["escalated_at"])
        ledger_append(
            run=run,
            actor=Actor.system("approval-escalation"),
            action="approval.escalated",
            payload={
                "approval_id": approval.public_id,
                "deadline": approval.deadline.isoformat(),
                **_target_ids(approval),
            },
        )
        changed(run, kind="approval.escalated")
    return True


# --------------------------------------------------------------------------------------------
# suspended for a reviewer (a worker released its lease with `suspend`)


def keeps_approvals(run: Run) -> bool:
    """A run its worker suspended to wait for reviewers (`lease_release(suspend=True)`): its
    waiting approvals stay open, are decided while no process holds the run, and the next
    lease (same epoch) picks the decisions up."""
    return run.status == RunStatus.SUSPENDED and bool(
        (run.interruption or {}).get("keeps_approvals")
    )


def settle_approved_while_suspended_locked(run: Run, *, now: datetime, why: str) -> list[str]:
    """The calls approved while the run was suspended for reviewers never ran: no worker held a
    lease since the suspension (a suspension with calls in flight is refused), so when the run
    is stopped or resumed at a new epoch instead of leased again, they are `not_started`, never
    `unknown`. Returns their tool_call_ids."""
    if not keeps_approvals(run):
        return []
    approved = list(
        ExecutionRecord.objects.select_for_update()
        .filter(run=run, execution_state=ExecutionState.PERMITTED)
        .order_by("id")
    )
    for record in approved:
        _never_ran(record, now=now, why=f"approved while suspended, never started: {why}")
    return [record.tool_call_id for record in approved]


# void (called by the stop and the interruption, in their transaction)


def void_waiting_approvals_locked(run: Run, *, now: datetime, why: str, actor: Actor) -> list[str]:
    """A stop never waits on an approval: every waiting one is void, its call never starts,
    its outbox item is frozen with the rest of the outbox."""
    # Most stops find nothing waiting: ask with the cheapest query first (the locking read
    # below, with its joins, cost a stop ~2.5 ms of ORM work for nothing). The run lock held
    # by the caller means no approval can start waiting in between.
    if not Approval.objects.filter(run=run, status=ApprovalStatus.WAITING).exists():
        return []
    waiting = list(
        Approval.objects.select_for_update(of=("self",))
        .select_related("execution_record", "outbox_item")
        .filter(run=run, status=ApprovalStatus.WAITING)
    )
    for approval in waiting:
        _stamp(approval, ApprovalStatus.VOID, actor=actor, now=now, message=why)
        approval.save(
            update_fields=["status", "decided_by", "decided_by_kind", "decided_at", "message"]
        )
        if approval.target == ApprovalTarget.TOOL_CALL:
            _never_ran(approval.execution_record, now=now, why=f"approval void: {why}")
        else:
            item = approval.outbox_item
            assert item is not None
            item.status = OutboxStatus.FROZEN
            item.frozen_at = now
            item.frozen_by_epoch = run.stop_epoch
            item.save(update_fields=["status", "frozen_at", "frozen_by_epoch", "updated_at"])
        ledger_append(
            run=run,
            actor=actor,
            action="approval.voided",
            reason=why[:60],
            payload={"approval_id": approval.public_id, **_target_ids(approval)},
        )
        notify.approval_decided(run, approval)
    return [approval.public_id for approval in waiting]
