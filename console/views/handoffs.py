"""The handoff inbox: runs handed to me or my teams, oldest first (or newest), filtered by
assignee; assign (to me or a teammate), accept, complete, return, close."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.utils.translation import gettext
from django.views.decorators.http import require_GET, require_POST

from console.access import request_access, require
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
from console.views.decisions import OfferedOn
from handoff import services as handoff_services
from handoff.models import Handoff
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
from runs.models import Role, Run

TEMPLATE = "console/handoffs.html"


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
            raise Http404(gettext("no such handoff"))
        card.can_act = request_access(request).can_act(card.handoff.run.team_id)
        context = {"card": card, "card_ok": outcome.ok, "card_error": outcome.error}
        return fragments(request, TEMPLATE, "card", context)

    return answer


# --------------------------------------------------------------------------------------------
# actions on a handoff: one function each, taking the cleaned form data, returning the line
# shown next to the card


def _assignee(request: HtmxHttpRequest, wanted: str) -> Any:
    """The user the assign form names: me, an active user by name, or nobody."""
    if wanted == ASSIGNEE_ME:
        return request.user
    if not wanted or wanted == ASSIGNEE_NONE:
        return None
    user = user_by_username(username=wanted)
    if user is None:
        raise InvalidInput(
            gettext("no active user %(wanted)s") % {"wanted": wanted}, field="assignee"
        )
    return user


def _assign(request: HtmxHttpRequest, handoff: Handoff, data: dict[str, Any]) -> str:
    user = _assignee(request, data["assignee"])
    handoff_services.handoff_assign(handoff_id=handoff.pk, assignee=user, actor=actor_of(request))
    if user is None:
        return gettext("Unassigned: anyone on the team may accept it.")
    if user.pk == request.user.pk:
        return gettext("Assigned to you: accept it when you start.")
    return gettext("Assigned to %(get_username)s: they accept it when they start.") % {
        "get_username": user.get_username()
    }


def _accept(request: HtmxHttpRequest, handoff: Handoff, data: dict[str, Any]) -> str:
    handoff_services.handoff_accept(
        handoff_id=handoff.pk,
        user=request.user,  # type: ignore[arg-type]
        actor=actor_of(request),
        take_from_assignee=data["take_from_assignee"],
    )
    return gettext("Accepted: this run is yours.")


def _return(request: HtmxHttpRequest, handoff: Handoff, data: dict[str, Any]) -> str:
    handoff_services.handoff_return(
        handoff_id=handoff.pk,
        actor=actor_of(request),
        checkpoint=data["checkpoint"],
        carry_over_steering=data["carry_over_steering"],
        note=data["note"],
    )
    return gettext("Returned to automation: the run is pending at a new epoch.")


def _complete(request: HtmxHttpRequest, handoff: Handoff, data: dict[str, Any]) -> str:
    handoff_services.handoff_complete(
        handoff_id=handoff.pk, actor=actor_of(request), note=data["note"]
    )
    return gettext("Completed by hand: the run is completed.")


def _close(request: HtmxHttpRequest, handoff: Handoff, data: dict[str, Any]) -> str:
    handoff_services.handoff_close(
        handoff_id=handoff.pk, actor=actor_of(request), note=data["note"]
    )
    return gettext("Closed: the run is cancelled.")


@dataclass(frozen=True)
class HandoffAction:
    """An action's form, bound to the POST, and what it does with the form's cleaned data."""

    form: Callable[[HtmxHttpRequest, Handoff], forms.Form]
    perform: Callable[[HtmxHttpRequest, Handoff, dict[str, Any]], str]


def _return_form(request: HtmxHttpRequest, handoff: Handoff) -> forms.Form:
    return ResumeForm(request.POST, checkpoints=checkpoint_labels(run_id=handoff.run_id))


ACTIONS: dict[str, HandoffAction] = {
    "assign": HandoffAction(lambda request, _: HandoffAssignForm(request.POST), _assign),
    "accept": HandoffAction(lambda request, _: HandoffAcceptForm(request.POST), _accept),
    "complete": HandoffAction(lambda request, _: NoteForm(request.POST), _complete),
    "return": HandoffAction(_return_form, _return),
    "close": HandoffAction(lambda request, _: CloseNoteForm(request.POST), _close),
}


@login_required
@require_POST
def handoff_action(request: HtmxHttpRequest, handoff_id: int, action: str) -> HttpResponse:
    chosen = ACTIONS.get(action)
    if chosen is None:
        raise Http404(gettext("no such action"))
    handoff = handoff_get(handoff_id=handoff_id)
    if handoff is None or not request_access(request).can_view(handoff.run.team_id):
        raise Http404(gettext("no such handoff"))
    require(request, handoff.run.team_id, Role.REVIEWER)
    return act(
        request,
        form=chosen.form(request, handoff),
        service=lambda data: chosen.perform(request, handoff, data),
        back=reverse("console:handoffs"),
        fragment=_card_answer(request, handoff_id),
    )


def _latest_card_answer(request: HtmxHttpRequest, run: Run) -> Callable[[Outcome], HttpResponse]:
    """htmx answer of a steering decision on a card: the run's newest handoff's card."""

    def answer(outcome: Outcome) -> HttpResponse:
        handoff_id = latest_handoff_id(run_id=run.pk)
        if handoff_id is None:
            raise Http404(gettext("no handoff for this run"))
        return _card_answer(request, handoff_id)(outcome)

    return answer


# Carry over or discard a handed-off run's unapplied steering from its inbox card (the view is
# console/views/decisions.py).
STEERING_OFFER = OfferedOn(
    back=lambda _run_id: reverse("console:handoffs"), answer=_latest_card_answer
)
