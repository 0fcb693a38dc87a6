"""The stop packet page (DESIGN §4): the immutable snapshot, printable and downloadable as JSON,
with the current resolution status on top and a control per unknown. An interrupted run's
`/packet/` is its interruption packet, with the same control per unknown."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.translation import gettext
from django.views.decorators.http import require_GET, require_POST

from console.access import request_access, run_for
from console.forms import ResolutionForm
from console.selectors.packets import (
    PacketView,
    interruption_view,
    packet_view,
    stop_packet_epochs,
    stop_packet_get,
)
from console.views.common import (
    HtmxHttpRequest,
    Outcome,
    act,
    actor_of,
    fragments,
    page,
    wants_fragment,
)
from console.views.decisions import OfferedOn
from handoff import services as handoff_services
from handoff.models import ResolutionDecision, StopPacket
from runs import services
from runs.labels import label_for
from runs.models import Role, Run, RunStatus
from runs.selectors import run_dirty_reasons

TEMPLATE = "console/packet.html"
INTERRUPTION_TEMPLATE = "console/interruption.html"
# An interruption packet is read now, not frozen: what a resolution changes beside the unknown's
# own card (the summary's "Unknown now", the tool calls' states, the resolutions) rides along.
INTERRUPTION_ALONG = ("head", "calls", "resolutions")


def _along(template: str) -> list[str]:
    return list(INTERRUPTION_ALONG) if template == INTERRUPTION_TEMPLATE else []


class NoPacket(Http404):
    """A 404 that says what is true about the run, not "a team you are not in": the run was
    found and the user may see it (`run_for` answered first)."""


def _no_packet_reason(run: Run, epoch: int | None) -> str:
    which = (
        gettext("no stop packet")
        if epoch is None
        else gettext("no stop packet for epoch %(epoch)s") % {"epoch": epoch}
    )
    if run.status == RunStatus.INTERRUPTED or run.interruption:
        return gettext(
            "This run has %(which)s: it was interrupted, not stopped. See its interruption."
        ) % {"which": which}
    if epoch is not None and stop_packet_get(run=run) is not None:
        return gettext("This run has %(which)s: it did not stop at that epoch.") % {"which": which}
    return gettext("This run has %(which)s: it has not been stopped (it is %(replace)s).") % {
        "which": which,
        "replace": label_for(run.status),
    }


def _packet(run: Run, epoch: int | None) -> StopPacket:
    packet = stop_packet_get(run=run, epoch=epoch)
    if packet is None:
        raise NoPacket(_no_packet_reason(run, epoch))
    return packet


def _no_packet_page(request: HtmxHttpRequest, run: Run, error: NoPacket) -> HttpResponse:
    return render(
        request,
        "404.html",
        {"message": str(error), "run": run, "run_link": True},
        status=404,
    )


def _shows_interruption(request: HtmxHttpRequest, run: Run) -> bool:
    """`/packet/` of an interrupted run is its interruption packet; so is the status region that
    page refetches live, after the run moved on (it then says what the run is now)."""
    return run.status == RunStatus.INTERRUPTED or (
        wants_fragment(request) and request.htmx.target == "interruption-status"
    )


def _current_view(request: HtmxHttpRequest, run: Run) -> tuple[str, PacketView]:
    """The page decisions are made on: the interruption packet of an interrupted run, else the
    latest stop packet."""
    everything = request.GET.get("all") == "1"
    if _shows_interruption(request, run):
        return INTERRUPTION_TEMPLATE, interruption_view(run, everything=everything)
    return TEMPLATE, packet_view(run, _packet(run, None), everything=everything)


def packet_context(
    request: HtmxHttpRequest, run: Run, view: PacketView, **extra: Any
) -> dict[str, Any]:
    # ?all=1 lists every completed step, call and artifact; the JSON download is always whole.
    epochs = stop_packet_epochs(run=run)
    can_act = request_access(request).can_act(run.team_id)
    return {
        "run": run,
        "packet_view": view,
        "snap": view.snap,
        "epochs": epochs,
        "can_resolve": can_act and view.is_current and run.status in services.RESOLVABLE_STATUSES,
        "can_act": can_act,
        "decisions": ResolutionDecision.choices,
        **extra,
    }


@login_required
@require_GET
def packet_latest(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id)
    if _shows_interruption(request, run):
        template, view = _current_view(request, run)
        context = packet_context(request, run, view)
        if wants_fragment(request) and request.htmx.target == "interruption-status":
            return fragments(request, template, "status", context, oob=_along(template))
        return page(request, template, context)
    try:
        packet = _packet(run, None)
    except NoPacket as error:
        return _no_packet_page(request, run, error)
    return HttpResponseRedirect(reverse("console:packet", args=[run.pk, packet.stop_epoch]))


@login_required
@require_GET
def packet_page(request: HtmxHttpRequest, run_id: str, epoch: int) -> HttpResponse:
    run = run_for(request, run_id)
    try:
        packet = _packet(run, epoch)
    except NoPacket as error:
        return _no_packet_page(request, run, error)
    everything = request.GET.get("all") == "1"
    context = packet_context(request, run, packet_view(run, packet, everything=everything))
    if wants_fragment(request) and request.htmx.target == "packet-status":
        return fragments(request, TEMPLATE, "status", context)
    return page(request, TEMPLATE, context)


@login_required
@require_GET
def packet_json(request: HtmxHttpRequest, run_id: str, epoch: int) -> HttpResponse:
    run = run_for(request, run_id)
    packet = _packet(run, epoch)
    body = json.dumps(packet.snapshot, indent=2, sort_keys=False, cls=DjangoJSONEncoder)
    response = HttpResponse(body + "\n", content_type="application/json")
    response["Content-Disposition"] = (
        f'attachment; filename="stop-packet-{run.pk}-epoch{packet.stop_epoch}.json"'
    )
    return response


def _frozen_answer(request: HtmxHttpRequest, run: Run) -> Callable[[Outcome], HttpResponse]:
    """htmx answer of a decision on a frozen item: the frozen section, the status out of band."""

    def answer(outcome: Outcome) -> HttpResponse:
        run.refresh_from_db()
        template, view = _current_view(request, run)
        context = packet_context(
            request, run, view, frozen_ok=outcome.ok, frozen_error=outcome.error
        )
        return fragments(request, template, "frozen", context, oob=["status"])

    return answer


# Release or discard a frozen item from the packet (the view is console/views/decisions.py).
OUTBOX_OFFER = OfferedOn(
    back=lambda run_id: reverse("console:packet_latest", args=[run_id]), answer=_frozen_answer
)


@login_required
@require_POST
def resolve(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Record one reviewer decision about an unknown; the run settles clean after the last."""
    run = run_for(request, run_id, need=Role.REVIEWER)
    form = ResolutionForm(request.POST)
    target = request.POST.get("target", "")
    target_id = request.POST.get("target_id", "")

    def record(data: dict[str, Any]) -> str:
        result = handoff_services.resolution_record(
            run_id=run.pk,
            target=data["target"],
            target_id=data["target_id"],
            decision=data["decision"],
            evidence=data["evidence"],
            actor=actor_of(request),
        )
        ok = gettext("Recorded as %(replace)s.") % {"replace": label_for(result.decision)}
        if result.run_status == "stopped_cleanly":
            ok += gettext(" That was the last unknown: the run is now stopped cleanly.")
        elif result.run_status == "handed_off":
            ok += gettext(" That was the last unknown: the run is stopped cleanly and handed off.")
        elif result.run_status == RunStatus.INTERRUPTED and not run_dirty_reasons(run):
            ok += gettext(" That was the last unknown: the run can be resumed from its page.")
        return ok

    def answer(outcome: Outcome) -> HttpResponse:
        run.refresh_from_db()
        template, view = _current_view(request, run)
        context = packet_context(request, run, view)
        unknown = next(
            (
                candidate
                for candidate in view.unknowns
                if candidate.target == target and candidate.target_id == target_id
            ),
            None,
        )
        if unknown is None:
            status_error = outcome.error or gettext("unknown target")
            return fragments(request, template, "status", {**context, "status_error": status_error})
        context.update(
            {
                "unknown": unknown,
                "card_ok": outcome.ok,
                "card_error": outcome.error,
                "card_form": form if outcome.error else None,
            }
        )
        return fragments(
            request, template, "unknown-card", context, oob=["status", *_along(template)]
        )

    return act(
        request,
        form=form,
        service=record,
        back=reverse("console:packet_latest", args=[run_id]),
        fragment=answer,
    )
