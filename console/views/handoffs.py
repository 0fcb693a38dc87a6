"""The handoff inbox: runs handed to me or my teams; accept, complete, return, close."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console.access import request_access, require
from console.forms import NoteForm, ResumeForm
from console.selectors import handoff_card, handoff_inbox
from console.views.common import (
    HtmxHttpRequest,
    actor_of,
    error_text,
    form_errors,
    fragments,
    page,
    redirect_with,
    wants_fragment,
)
from handoff import services as handoff_services
from handoff.models import Handoff
from runs.errors import DomainError
from runs.models import Role, Run

TEMPLATE = "console/handoffs.html"
ACTIONS = ("accept", "complete", "return", "close")


@login_required
@require_GET
def handoffs(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    mine = request.GET.get("mine") == "1"
    cards, ended = handoff_inbox(access, user_id=request.user.pk, mine_only=mine)
    context = {"cards": cards, "ended": ended, "mine": mine}
    if wants_fragment(request) and request.htmx.target == "handoff-list":
        return fragments(request, TEMPLATE, "list", context)
    return page(request, TEMPLATE, context)


def _card_response(
    request: HtmxHttpRequest, handoff_id: int, *, ok: str = "", error: str = ""
) -> HttpResponse:
    card = handoff_card(handoff_id)
    if card is None:
        raise Http404("no such handoff")
    card.can_act = request_access(request).can_act(card.handoff.run.team_id)
    return fragments(request, TEMPLATE, "card", {"card": card, "card_ok": ok, "card_error": error})


def handoff_card_response(
    request: HtmxHttpRequest, run: Run, *, ok: str = "", error: str = ""
) -> HttpResponse:
    """Used by the steering decision when it was made from the inbox."""
    handoff = Handoff.objects.filter(run=run).order_by("-created_at", "-pk").first()
    if handoff is None:
        raise Http404("no handoff for this run")
    return _card_response(request, handoff.pk, ok=ok, error=error)


@login_required
@require_POST
def handoff_action(request: HtmxHttpRequest, handoff_id: int, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("no such action")
    handoff = Handoff.objects.select_related("run").filter(pk=handoff_id).first()
    if handoff is None or not request_access(request).can_view(handoff.run.team_id):
        raise Http404("no such handoff")
    require(request, handoff.run.team_id, Role.REVIEWER)
    actor = actor_of(request)
    ok, error = "", ""
    try:
        if action == "accept":
            handoff_services.handoff_accept(handoff_id=handoff.pk, user=request.user, actor=actor)  # type: ignore[arg-type]
            ok = "Accepted: this run is yours."
        elif action == "return":
            labels = list(handoff.run.checkpoints.order_by("pk").values_list("label", flat=True))
            form = ResumeForm(request.POST, checkpoints=labels)
            if not form.is_valid():
                raise _Invalid(form_errors(form))
            handoff_services.handoff_return(
                handoff_id=handoff.pk,
                actor=actor,
                checkpoint=form.cleaned_data["checkpoint"],
                carry_over_steering=form.cleaned_data["carry_over_steering"],
                note=form.cleaned_data["note"],
            )
            ok = "Returned to automation: the run is pending at a new epoch."
        else:
            note_form = NoteForm(request.POST)
            if not note_form.is_valid():
                raise _Invalid(form_errors(note_form))
            note = note_form.cleaned_data["note"]
            if action == "complete":
                handoff_services.handoff_complete(handoff_id=handoff.pk, actor=actor, note=note)
                ok = "Completed by hand: the run is completed."
            else:
                handoff_services.handoff_close(handoff_id=handoff.pk, actor=actor, note=note)
                ok = "Closed: the run is cancelled."
    except DomainError as exc:
        error = error_text(exc)
    except _Invalid as exc:
        error = str(exc)
    if not request.htmx:
        return redirect_with(request, reverse("console:handoffs"), ok=ok, error=error or None)
    return _card_response(request, handoff.pk, ok=ok, error=error)


class _Invalid(Exception):
    pass
