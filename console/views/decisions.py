"""Decisions offered on more than one page: a frozen outbox item (the run page and the stop
packet) and an unapplied steering message (the run page and the handoff inbox).

Each page has its own endpoint and its own answer; what they share — the form, the lookups and
the service call, as the pieces `common.act` takes — is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import Http404, HttpRequest

from console.forms import SteeringDecisionForm
from console.selectors.run import outbox_item_get
from console.views.common import actor_of
from runs import services
from runs.models import Run

OUTBOX_DECISIONS = ("release", "discard")


def check_outbox_decision(decision: str) -> None:
    if decision not in OUTBOX_DECISIONS:
        raise Http404("no such decision")


def outbox_decision(
    request: HttpRequest, run: Run, item_id: int, decision: str
) -> Callable[[dict[str, Any]], str]:
    """Release or discard one frozen item of `run` (404 if the run has no such item)."""
    check_outbox_decision(decision)
    item = outbox_item_get(run_id=run.pk, item_id=item_id)
    if item is None:
        raise Http404("no such outbox item")
    note = request.POST.get("note", "")[:500]
    release = decision == "release"

    def call(_data: dict[str, Any]) -> str:
        service = services.outbox_release if release else services.outbox_discard
        service(run_id=run.pk, item_id=item.pk, actor=actor_of(request), note=note)
        return f"{item.public_id} {'released: it will be dispatched' if release else 'discarded'}."

    return call


def steering_decision(
    request: HttpRequest, run: Run, message_id: int
) -> tuple[SteeringDecisionForm, Callable[[dict[str, Any]], str]]:
    """Carry an unapplied message over to the next round, or discard it."""

    def call(data: dict[str, Any]) -> str:
        carry = data["decision"] == "carry_over"
        services.steering_decide(
            run_id=run.pk, message_id=message_id, carry_over=carry, actor=actor_of(request)
        )
        return "Carried over to the next round." if carry else "Discarded."

    return SteeringDecisionForm(request.POST), call
