"""Approval gates (DESIGN §10), the holding side: which rule holds a tool call or an outbox
item, and the waiting `Approval` it gets, written under the permit's or the enqueue's run lock
(`hold_for_approval`). Deciding, expiring and voiding are `approvals.py`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from runs.actors import Actor
from runs.argument_schemas import arguments_schema_check
from runs.errors import (
    ApprovalClosed,
    ApprovalRateLimited,
    InvalidInput,
)
from runs.hooks import PolicyVerdict
from runs.ledger import ledger_append
from runs.models import (
    Approval,
    ApprovalAppliesTo,
    ApprovalRisk,
    ApprovalRule,
    ApprovalStatus,
    ApprovalTarget,
    ExecutionRecord,
    OutboxItem,
    Run,
    SideEffect,
)
from runs.services._base import run_mark_changed

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
            **approval_target_ids(approval),
        },
    )
    run_mark_changed(run, kind="approval.requested")
    return approval


@dataclass(frozen=True)
class ApprovalAsk:
    """What an agent may add to a permit or an outbox item about a review: hold it even if no
    rule matches (`needs_approval`), and what the reviewer reads (`summary`, `risk`, the
    `arguments_schema` an edit must match, already checked by `validate_arguments_schema`)."""

    needs_approval: bool = False
    summary: str = ""
    risk: str = ""
    arguments_schema: dict[str, Any] | None = None


def approval_gate(
    verdict: PolicyVerdict, by_rules: Callable[[], GateAnswer | None]
) -> GateAnswer | None:
    """Why the ask waits, if it does: a policy's hold first, else the team's rules (`by_rules`,
    which also holds what the agent asked to have reviewed)."""
    if verdict.hold:
        return GateAnswer(None, verdict.hold, verdict.hold_name)
    return by_rules()


def hold_for_approval(
    run: Run,
    gate: GateAnswer | None,
    held: ExecutionRecord | OutboxItem,
    *,
    ask: ApprovalAsk,
    actor: Actor,
    now: datetime,
) -> Approval | None:
    """The waiting `Approval` of a call or item just written `awaiting_approval` (`gate` not
    None), under the caller's run lock; None when nothing holds it."""
    if gate is None:
        return None
    return approval_request_locked(
        run,
        gate=gate,
        actor=actor,
        now=now,
        record=held if isinstance(held, ExecutionRecord) else None,
        item=held if isinstance(held, OutboxItem) else None,
        summary=ask.summary,
        risk=ask.risk,
        arguments_schema=ask.arguments_schema,
    )


def approval_target_ids(approval: Approval) -> dict[str, Any]:
    if approval.target == ApprovalTarget.TOOL_CALL:
        assert approval.execution_record is not None
        return {"tool_call_id": approval.execution_record.tool_call_id}
    assert approval.outbox_item is not None
    return {"outbox_id": approval.outbox_item.public_id}
