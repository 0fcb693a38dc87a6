"""Decisions offered on more than one page: a frozen outbox item (the run page, the stop packet
and the interruption packet) and an unapplied steering message (the run page and the handoff
inbox).

One view per decision. A control posts to an endpoint of the page it is on, and the URLconf
names that page for the view (`on`, an `OfferedOn`): where a plain POST goes back to, and which
of the page's regions an htmx POST gets back. So the answer never depends on a hidden field, and
no page module imports another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.utils.translation import gettext
from django.views.decorators.http import require_POST

from console.access import run_for
from console.forms import SteeringDecisionForm
from console.selectors.run import outbox_item_get
from console.views.common import HtmxHttpRequest, Outcome, act, actor_of
from runs import services
from runs.models import Role, Run

OUTBOX_DECISIONS = ("release", "discard")


@dataclass(frozen=True)
class OfferedOn:
    """A page a decision is offered on: `back(run_id)` is where a plain POST redirects to;
    `answer(request, run)` renders the page's regions for an htmx POST's outcome."""

    back: Callable[[str], str]
    answer: Callable[[HtmxHttpRequest, Run], Callable[[Outcome], HttpResponse]]


@login_required
@require_POST
def outbox_decide(
    request: HtmxHttpRequest, run_id: str, item_id: int, decision: str, *, on: OfferedOn
) -> HttpResponse:
    """Release or discard one frozen item of the run (404 for another decision or item)."""
    if decision not in OUTBOX_DECISIONS:
        raise Http404(gettext("no such decision"))
    run = run_for(request, run_id, need=Role.REVIEWER)
    item = outbox_item_get(run_id=run.pk, item_id=item_id)
    if item is None:
        raise Http404(gettext("no such outbox item"))
    note = request.POST.get("note", "")[:500]

    def decide(_data: dict[str, Any]) -> str:
        if decision == "release":
            services.outbox_release(
                run_id=run.pk, item_id=item.pk, actor=actor_of(request), note=note
            )
            return gettext("%(item)s released: it will be dispatched.") % {"item": item.public_id}
        services.outbox_discard(run_id=run.pk, item_id=item.pk, actor=actor_of(request), note=note)
        return gettext("%(item)s discarded.") % {"item": item.public_id}

    return act(
        request, form=None, service=decide, back=on.back(run_id), fragment=on.answer(request, run)
    )


@login_required
@require_POST
def steering_decide(
    request: HtmxHttpRequest, run_id: str, message_id: int, *, on: OfferedOn
) -> HttpResponse:
    """Carry an unapplied message over to the next round, or discard it."""
    run = run_for(request, run_id, need=Role.REVIEWER)

    def decide(data: dict[str, Any]) -> str:
        carry = data["decision"] == "carry_over"
        services.steering_decide(
            run_id=run.pk, message_id=message_id, carry_over=carry, actor=actor_of(request)
        )
        return gettext("Carried over to the next round.") if carry else gettext("Discarded.")

    return act(
        request,
        form=SteeringDecisionForm(request.POST),
        service=decide,
        back=on.back(run_id),
        fragment=on.answer(request, run),
    )
