"""The handoff inbox: runs handed to me or my teams, oldest first (or newest), filtered by
assignee; assign (to me or a teammate), accept, complete, return, close."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console.access import request_access, require, run_for
from console.forms import (
    CloseNoteForm,
    HandoffAcceptForm,
    HandoffAssignForm,
    HandoffFilterForm,
    NoteForm,
    ResumeForm,
)
from console.selectors.run import checkpoint_labels
from console.views.common import (
    HtmxHttpRequest,
    Outcome,
    act,
    actor_of,
    filter_errors,
    fragments,
    page,
    wants_fragment,
)
from console.views.decisions import steering_decision
from handoff import services as handoff_services
from handoff.selectors import (
    ASSIGNEE_ME,
    ASSIGNEE_NONE,
    handoff_card,
    handoff_get,
    handoff_inbox,
    latest_handoff_id,
    user_by_username,
)
from runs.errors import InvalidInput
from runs.models import Role

TEMPLATE = "console/handoffs.html"
ACTIONS = ("assign", "accept", "complete", "return", "close")


@login_required
@require_GET
def handoffs(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    form = HandoffFilterForm(request.GET)
    readable = form.is_valid()
    data = form.cleaned_data if readable else {}
    assignee = ASSIGNEE_ME if data.get("mine") == "1" else (data.get("assignee") or "")
    oldest_first = data.get("sort") != "newest"
    cards, ended, teammates = handoff_inbox(
        access, user_id=request.user.pk, assignee=assignee, oldest_first=oldest_first
    )
    if not readable:
        # A filter that cannot be read shows no handoffs (and says why), never every handoff.
        cards, ended = [], []
    context = {
        "filter_errors": filter_errors(form),
        "cards": cards,
        "ended": ended,
        "mine": assignee == ASSIGNEE_ME,
        "assignee": assignee,
        "sort": "oldest" if oldest_first else "newest",
        "people": sorted({name for names in teammates.values() for name in names}),
        "filtered": bool(assignee),
    }
    if wants_fragment(request) and request.htmx.target == "handoff-list":
        return fragments(request, TEMPLATE, "list", context)
    return page(request, TEMPLATE, context)


def _card_answer(request: HtmxHttpRequest, handoff_id: int) -> Callable[[Outcome], HttpResponse]:
    """htmx answer of an action on the inbox: the handoff's card, re-read."""

    def answer(outcome: Outcome) -> HttpResponse:
        card = handoff_card(handoff_id)
        if card is None:
            raise Http404("no such handoff")
        card.can_act = request_access(request).can_act(card.handoff.run.team_id)
        context = {"card": card, "card_ok": outcome.ok, "card_error": outcome.error}
        return fragments(request, TEMPLATE, "card", context)

    return answer


@login_required
@require_POST
def handoff_action(request: HtmxHttpRequest, handoff_id: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("no such action")
    handoff = handoff_get(handoff_id=handoff_id)
    if handoff is None or not request_access(request).can_view(handoff.run.team_id):
        raise Http404("no such handoff")
    require(request, handoff.run.team_id, Role.REVIEWER)
    actor = actor_of(request)
    form: forms.Form | None
    service: Callable[[dict[str, Any]], str]

    if action == "assign":
        form = HandoffAssignForm(request.POST)

        def service(data: dict[str, Any]) -> str:
            wanted = data["assignee"]
            if wanted == ASSIGNEE_ME:
                user = request.user
            elif wanted and wanted != ASSIGNEE_NONE:
                user = user_by_username(username=wanted)
                if user is None:
                    raise InvalidInput(f"no active user {wanted}", field="assignee")
            else:
                user = None
            handoff_services.handoff_assign(handoff_id=handoff_id, assignee=user, actor=actor)  # type: ignore[arg-type]
            if user is None:
                return "Unassigned: anyone on the team may accept it."
            if user.pk == request.user.pk:
                return "Assigned to you: accept it when you start."
            return f"Assigned to {user.get_username()}: they accept it when they start."

    elif action == "accept":
        form = HandoffAcceptForm(request.POST)

        def service(data: dict[str, Any]) -> str:
            handoff_services.handoff_accept(
                handoff_id=handoff_id,
                user=request.user,  # type: ignore[arg-type]
                actor=actor,
                take_from_assignee=data["take_from_assignee"],
            )
            return "Accepted: this run is yours."

    elif action == "return":
        form = ResumeForm(request.POST, checkpoints=checkpoint_labels(run_id=handoff.run_id))

        def service(data: dict[str, Any]) -> str:
            handoff_services.handoff_return(
                handoff_id=handoff_id,
                actor=actor,
                checkpoint=data["checkpoint"],
                carry_over_steering=data["carry_over_steering"],
                note=data["note"],
            )
            return "Returned to automation: the run is pending at a new epoch."

    elif action == "complete":
        form = NoteForm(request.POST)

        def service(data: dict[str, Any]) -> str:
            handoff_services.handoff_complete(handoff_id=handoff_id, actor=actor, note=data["note"])
            return "Completed by hand: the run is completed."

    else:
        form = CloseNoteForm(request.POST)

        def service(data: dict[str, Any]) -> str:
            handoff_services.handoff_close(handoff_id=handoff_id, actor=actor, note=data["note"])
            return "Closed: the run is cancelled."

    return act(
        request,
        form=form,
        service=service,
        back=reverse("console:handoffs"),
        fragment=_card_answer(request, handoff_id),
    )


@login_required
@require_POST
def steering_decide(request: HtmxHttpRequest, run_id: str, message_id: int) -> HttpResponse:
    """Carry over or discard a handed-off run's unapplied steering from its inbox card."""
    run = run_for(request, run_id, need=Role.REVIEWER)
    form, decide = steering_decision(request, run, message_id)

    def answer(outcome: Outcome) -> HttpResponse:
        handoff_id = latest_handoff_id(run_id=run.pk)
        if handoff_id is None:
            raise Http404("no handoff for this run")
        return _card_answer(request, handoff_id)(outcome)

    return act(
        request, form=form, service=decide, back=reverse("console:handoffs"), fragment=answer
    )
