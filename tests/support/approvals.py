"""Approvals as the console tests need them: a call held for a reviewer, and its page's URL."""

from __future__ import annotations

import itertools
from typing import Any

from runs import services
from runs.actors import Actor
from runs.models import Approval, ApprovalRule, Team
from tests.support.scenarios import AGENT, new_run, start

_calls = itertools.count(1)

SCHEMA = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "maximum": 500},
        "order": {"type": "string"},
    },
    "required": ["amount", "order"],
    "additionalProperties": False,
}


def waiting(
    team: Team,
    *,
    tool: str = "payments.refund",
    agent: str = "billing-bot",
    risk: str = "high",
    summary: str = "Refund order 1042",
    arguments: dict[str, Any] | None = None,
    schema: dict[str, Any] | None = None,
    title: str = "Customer refunds",
) -> Approval:
    """A running run whose tool call asked for approval (as the agent would)."""
    run = new_run(team, title=title, agent=agent)
    lease = start(run)
    record, _created = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id=f"call_{next(_calls)}",
        tool=tool,
        actor=AGENT,
        side_effect="write",
        arguments=arguments if arguments is not None else {"amount": 120, "order": "1042"},
        needs_approval=True,
        summary=summary,
        risk=risk,
        arguments_schema=schema,
    )
    record.refresh_from_db()
    return Approval.objects.get(execution_record=record)


def rule(team: Team, name: str, **fields: Any) -> ApprovalRule:
    return services.approval_rule_create(
        team_id=team.pk, actor=Actor.system("test"), name=name, **fields
    )


def url(approval: Approval, suffix: str = "") -> str:
    return f"/approvals/{approval.public_id}/{suffix}"
