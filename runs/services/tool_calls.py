"""Tool calls: the permit (the intent, written under the run lock before the call starts) and
the result (accepted after a stop, as a fact).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from runs import hooks, notify
from runs.actors import Actor
from runs.errors import (
    BudgetExhausted,
    IllegalTransition,
    InvalidInput,
    NotFound,
    RunNotRunning,
    StaleEpoch,
    ToolCallConflict,
)
from runs.ledger import ledger_append, ledger_entry_pending
from runs.models import (
    Approval,
    ExecutionRecord,
    ExecutionState,
    RecoveryPolicy,
    Run,
    RunStatus,
    SideEffect,
    SideEffectState,
    StopReason,
)
from runs.selectors import team_budget_refusal
from runs.services._base import (
    RESULT_STATES,
    apply_tool_result,
    check_work_may_start,
    reject_late_write,
)
from runs.services._permit_sql import PermitReads, locked_run_for_permit, write_permit
from runs.services._result_sql import locked_run_for_result
from runs.services.approval_gate import (
    ApprovalAsk,
    approval_gate,
    gate_for_call,
    hold_for_approval,
    refuse_if_approval_closed,
    validate_arguments_schema,
    validate_risk,
)
from runs.services.budget import budget_exceeded
from runs.services.lifecycle import settle_dirty_if_resolved, stop_locked


@dataclass(frozen=True)
class PermitRequest:
    """One tool call an agent asks to start (DESIGN §5): the permit request's fields, as the API's
    `PermitIn` reads them and the wire sends them (the epoch and the run aside)."""

    tool_call_id: str
    tool: str
    side_effect: str = SideEffect.NONE
    arguments: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str = ""
    operation_id: str = ""
    recovery_policy: str = ""
    step_key: str = ""
    needs_approval: bool = False
    summary: str = ""
    risk: str = ""
    arguments_schema: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.arguments is None:  # "no arguments" is an empty object, as the record keeps it
            object.__setattr__(self, "arguments", {})


def permit_request(
    *,
    run_id: str,
    epoch: int,
    actor: Actor,
    request: PermitRequest | None = None,
    on_granted: Callable[[bool], None] | None = None,
    **fields: Any,
) -> tuple[ExecutionRecord, bool]:
    """Grant a start permit for one tool call, or refuse it. Returns (record, created).

    The permit *is* the intent record: it is written under the run lock, so a stop recorded a
    microsecond earlier refuses it, and a stop a microsecond later finds it as in-flight work.

    A call that a team rule (or the agent's `needs_approval`) holds is recorded the same way
    but `awaiting_approval`, with a waiting `Approval` (`record.approval`): no permit exists
    until a reviewer approves it (DESIGN §10). Asked again, a held call answers the same
    record; one whose approval was rejected, expired or voided raises `ApprovalClosed`.

    A `tool_call_id` names one call (DESIGN §5): asked again with the same tool and arguments
    it is a retry and answers the same record; with another tool or other arguments it raises
    `ToolCallConflict` and grants nothing. The check runs under the run lock, so of two
    different asks racing for one id exactly one gets the permit.

    `request`, or its fields as keywords (`tool_call_id=..., tool=..., ...`).

    `on_granted(holds_possible)` is called once the permit is decided — granted, not held — and
    before its record is written: the run lock is held until the record commits, so nothing
    can stop the run in between. For the MCP gateway's reads beside their permit (DESIGN §15),
    whose answer needs the decision, not its commit. `holds_possible`: the team has an enabled
    approval rule or ever had a policy (`ExecutionRecord.holds_possible`).
    """
    if request is None:
        request = PermitRequest(**fields)
    elif fields:
        raise TypeError(f"permit_request: {sorted(fields)} given with a request")
    ask = ApprovalAsk(
        request.needs_approval,
        request.summary,
        validate_risk(request.risk),
        validate_arguments_schema(request.arguments_schema),
    )
    tool_call_id, tool, arguments = request.tool_call_id, request.tool, request.arguments
    refusal: StaleEpoch | RunNotRunning | BudgetExhausted | None = None
    with locked_run_for_permit(
        run_id, tool_call_id=tool_call_id, step_key=request.step_key
    ) as opening:
        run, reads = opening.run, opening.reads
        now = timezone.now()
        refusal = check_work_may_start(run, epoch, now=now, lease=reads.lease)
        if refusal is None:
            existing = (
                ExecutionRecord.objects.filter(run=run, tool_call_id=tool_call_id).first()
                if reads.asked_before
                else None
            )
            if existing is not None:
                _refuse_another_call(run, existing, tool=tool, arguments=arguments)
                if existing.permit_epoch != epoch:
                    raise IllegalTransition.for_run(
                        run,
                        f"tool call {tool_call_id} was already permitted at epoch {existing.permit_epoch}",
                    )
                refuse_if_approval_closed(existing, run)
                return existing, False
            budget_reason = budget_exceeded(run, now=now, adding_tool_call=True)
            team_refusal = (
                None
                if budget_reason or not reads.team_budget_set
                else _team_budget_refusal_locked(run, now=now)
            )
            if team_refusal is not None:
                refusal = team_refusal
            elif budget_reason:
                stop_locked(
                    run,
                    reason=budget_reason,
                    note="budget enforced at permit",
                    actor=Actor.system("budget"),
                    now=now,
                )
                refusal = RunNotRunning.for_run(
                    run, f"the run's budget is exhausted ({budget_reason}); it is stopping"
                )
            elif (
                verdict := hooks.policies().permit(
                    run,
                    tool=tool,
                    arguments=arguments,
                    side_effect=request.side_effect,
                    now=now,
                    read=opening.checks_read,
                )
            ).stopped:
                refusal = RunNotRunning.for_run(run, verdict.stopped)
            else:
                gate = approval_gate(
                    verdict,
                    lambda: gate_for_call(
                        run,
                        tool=tool,
                        side_effect=request.side_effect,
                        needs_approval=request.needs_approval,
                        rules_exist=reads.rules_exist,
                    ),
                )
                holds_possible = reads.rules_exist or not hooks.policies().quiet(
                    opening.checks_read
                )
                if gate is None and on_granted is not None:
                    on_granted(holds_possible)
                record = _create_permit(
                    run,
                    request,
                    reads=reads,
                    now=now,
                    held=gate is not None,
                    epoch=epoch,
                    actor=actor,
                )
                hold_for_approval(run, gate, record, ask=ask, actor=actor, now=now)
                record.holds_possible = holds_possible
                return record, True
    assert refusal is not None
    if isinstance(refusal, BudgetExhausted):
        raise refusal
    reject_late_write(run_id, kind="permit", epoch=epoch, error=refusal)
    raise refusal


def _team_budget_refusal_locked(run: Run, *, now: datetime) -> BudgetExhausted | None:
    """A team over its daily or monthly budget gets no permit: the run is stopped through the
    stop path (`budget_exhausted`, the budget named in its note) and the answer is
    `409 budget_exhausted` naming the budget, until an admin raises it or the period ends."""
    budget, note = team_budget_refusal(run.team_id, now=now)
    if not budget:
        return None
    stop_locked(
        run, reason=StopReason.BUDGET_EXHAUSTED, note=note, actor=Actor.system("budget"), now=now
    )
    return BudgetExhausted.for_run(
        run,
        f"the team's budget is used up ({note}); an admin of the team can raise it",
        budget=budget,
    )


def _refuse_another_call(
    run: Run, existing: ExecutionRecord, *, tool: str, arguments: dict[str, Any]
) -> None:
    """Raise `ToolCallConflict` unless this ask is the one `existing` was first asked as.

    An approval may have replaced the record's arguments with a reviewer's edit; the id was
    asked with the originals, which the approval keeps, and a client asking again after the
    decision sends those.
    """
    asked = (
        Approval.objects.filter(execution_record=existing)
        .values_list("original_arguments", flat=True)
        .first()
    )
    first_arguments = existing.arguments if asked is None else asked
    if existing.tool == tool and first_arguments == arguments:
        return
    what = (
        f"for tool {existing.tool!r}, not {tool!r}"
        if existing.tool != tool
        else f"for {tool!r} with other arguments"
    )
    raise ToolCallConflict.for_run(
        run,
        f"tool call {existing.tool_call_id} was first asked {what}; a tool_call_id names one "
        "call and this one was granted nothing: give it its own id",
        tool_call_id=existing.tool_call_id,
        first_tool=existing.tool,
        first_arguments=first_arguments,
    )


def _create_permit(
    run: Run,
    request: PermitRequest,
    *,
    reads: PermitReads,
    now: datetime,
    held: bool,
    epoch: int,
    actor: Actor,
) -> ExecutionRecord:
    side_effect = request.side_effect
    record = ExecutionRecord(
        run=run,
        step_id=reads.step_id,
        tool_call_id=request.tool_call_id,
        tool=request.tool,
        arguments=request.arguments,
        side_effect=side_effect,
        idempotency_key=request.idempotency_key,
        operation_id=request.operation_id,
        permit_epoch=epoch,
        recovery_policy=request.recovery_policy or RecoveryPolicy.MANUAL_CONFIRMATION,
        execution_state=(ExecutionState.AWAITING_APPROVAL if held else ExecutionState.PERMITTED),
        # A held call cannot have run yet: its write becomes unconfirmed once it is approved.
        side_effect_state=(
            SideEffectState.PENDING_VERIFICATION
            if side_effect == SideEffect.WRITE and not held
            else SideEffectState.NONE
        ),
    )
    run.tool_calls_count += 1
    # Safe as a Python increment: the caller holds the run row lock.
    run.change_seq += 1
    action = "tool.held" if held else "tool.permitted"
    payload = {
        "tool_call_id": request.tool_call_id,
        "tool": request.tool,
        "side_effect": side_effect,
        "epoch": epoch,
    }
    entry = ledger_entry_pending(
        run=run, actor=actor, action=action, payload=payload, head=reads.ledger_head
    )
    # With the entry, in one round trip; with the COMMIT too unless the call is held (its
    # approval is written after).
    write_permit(run, record, now=now, entry=entry, commit=not held)
    if entry is None:
        ledger_append(run=run, actor=actor, action=action, payload=payload, head=reads.ledger_head)
    notify.run_changed(run, kind=action)
    return record


def tool_result_report(
    *,
    run_id: str,
    tool_call_id: str,
    execution_state: str,
    actor: Actor,
    operation_id: str = "",
    observation: str = "",
    output_truncated: bool = False,
    remote_cancel_state: str = "",
    source: str = "worker",
    recovery_action: str = "",
) -> ExecutionRecord:
    """Record the outcome of a permitted call. Accepted after a stop, as a fact.

    Two facts are never overwritten: a verified success, and a reviewer's resolution.
    """
    if execution_state not in RESULT_STATES:
        raise InvalidInput(
            f"execution_state must be one of {sorted(RESULT_STATES)}", field="execution_state"
        )
    with locked_run_for_result(run_id, tool_call_id=tool_call_id) as opening:
        run, reads = opening.run, opening.reads
        record = reads.record
        if record is None:
            raise NotFound(f"tool call {tool_call_id} was never permitted on run {run_id}")
        now = timezone.now()
        apply_tool_result(
            run,
            record,
            # Nothing is written after the result's own writes: no policy to count it, no dirty
            # stop it could settle.
            last_write=(
                hooks.policies().quiet(opening.checks_read)
                and run.status != RunStatus.STOPPED_DIRTY
            ),
            execution_state=execution_state,
            operation_id=operation_id,
            observation=observation,
            output_truncated=output_truncated,
            remote_cancel_state=remote_cancel_state,
            source=source,
            recovery_action=recovery_action,
            actor=actor,
            now=now,
            ledger_head=reads.ledger_head,
        )
        hooks.policies().tool_result(
            run,
            tool=record.tool,
            execution_state=record.execution_state,
            now=now,
            read=opening.checks_read,
        )
        settle_dirty_if_resolved(run, actor=Actor.system("reconciler"), now=now)
    return record
