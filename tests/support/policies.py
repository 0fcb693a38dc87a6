"""Helpers for the policy tests: a policy saved through the service, a permit, a batch."""

from __future__ import annotations

from typing import Any

from policies.models import Policy
from policies.services import policy_create
from runs import services
from runs.actors import Actor
from runs.models import Run, Team
from tests.support.scenarios import AGENT

ADMIN = Actor(kind="user", id="1", name="alice")


def policy(team: Team, name: str, expression: str, action: str = "stop", **fields: Any) -> Policy:
    fields.setdefault("mode", "enforce")
    return policy_create(
        team_id=team.pk, actor=ADMIN, name=name, expression=expression, action=action, **fields
    )


def permit(run: Run, call_id: str, tool: str = "search", **extra: Any):
    return services.permit_request(
        run_id=run.pk,
        epoch=extra.pop("epoch", run.stop_epoch),
        tool_call_id=call_id,
        tool=tool,
        side_effect=extra.pop("side_effect", "none"),
        arguments=extra.pop("arguments", {"q": "same"}),
        actor=AGENT,
        **extra,
    )


def result(run: Run, call_id: str, state: str = "failed"):
    return services.tool_result_report(
        run_id=run.pk, tool_call_id=call_id, execution_state=state, actor=AGENT
    )


def batch(run: Run, *events: dict[str, Any]):
    return services.events_ingest(
        run_id=run.pk, epoch=run.stop_epoch, events=list(events), actor=AGENT
    )
