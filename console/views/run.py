"""The run page, live, and the reviewer actions on it: stop, take over, resume, close, steer.

Page regions (each a `{% partialdef %}` of console/run.html, refreshed by htmx when the run's
websocket says the run changed):
- `summary`: status, epoch, stop reason, lease and heartbeat, the stop progression;
- `actions`: what this user may do now (refreshed only when the status or epoch changes, so a
  half-typed note is not wiped by an unrelated event);
- `detail`: steps, tool calls, outbox, artifacts, checkpoints, steering, this run's ledger.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from console.access import request_access, run_for
from console.forms import NoteForm, ResumeForm, SteeringDecisionForm, SteeringForm, StopForm
from console.selectors import run_detail
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
from runs import services
from runs.errors import DomainError
from runs.models import (
    STOPPABLE_STATUSES,
    STOPPED_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    OutboxItem,
    Role,
    Run,
    RunStatus,
)

TEMPLATE = "console/run.html"


def run_context(request: HtmxHttpRequest, run: Run, **extra: Any) -> dict[str, Any]:
    access = request_access(request)
    detail = run_detail(run, everything=request.GET.get("all") == "1")
    status = run.status
    can_act = access.can_act(run.team_id)
    checkpoints = [checkpoint.label for checkpoint in detail.checkpoints]
    context: dict[str, Any] = {
        "run": run,
        "d": detail,
        "can_act": can_act,
        "can_admin": access.can_admin(run.team_id),
        "is_stoppable": status in STOPPABLE_STATUSES,
        "is_stopping": status in STOPPING_STATUSES,
        "is_stopped": status in STOPPED_STATUSES,
        "is_terminal": status in TERMINAL_STATUSES,
        "can_resume": status in services.RESUMABLE_STATUSES and status != RunStatus.HANDED_OFF,
        "can_close": status == RunStatus.STOPPED_CLEANLY,
        "can_take_over": status in (*STOPPABLE_STATUSES, *STOPPING_STATUSES, *STOPPED_STATUSES),
        "takeover_pending": bool(
            detail.stop_request
            and detail.stop_request.takeover
            and status != RunStatus.HANDED_OFF
            and status not in STOPPABLE_STATUSES
        ),
        "stop_form": StopForm(admin=access.can_admin(run.team_id)),
        "takeover_form": NoteForm(),
        "resume_form": ResumeForm(checkpoints=checkpoints),
        "close_form": NoteForm(),
        "steering_form": SteeringForm(),
        "drain_deadline_seconds": settings.SAFESTOP_DRAIN_DEADLINE_SECONDS,
    }
    context.update(extra)
    return context


@login_required
@require_GET
def run_page(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id)
    context = run_context(request, run)
    if wants_fragment(request):
        if request.htmx.target == "run-summary":
            # The actions region comes along when the page saw the status change (?with=actions).
            also = ["actions"] if "actions" in request.GET.get("with", "").split(",") else []
            return fragments(request, TEMPLATE, "summary", context, oob=["detail", *also])
        if request.htmx.target == "run-actions":
            return fragments(request, TEMPLATE, "actions", context)
    return page(request, TEMPLATE, context)


def _after_action(
    request: HtmxHttpRequest,
    run_id: str,
    *,
    ok: str = "",
    error: DomainError | str | None = None,
    **extra: Any,
) -> HttpResponse:
    """htmx: the new actions region, with summary and detail out of band. Otherwise redirect."""
    if not request.htmx:
        return redirect_with(request, reverse("console:run", args=[run_id]), ok=ok, error=error)
    run = run_for(request, run_id)
    message = error_text(error) if isinstance(error, DomainError) else (error or "")
    context = run_context(request, run, action_ok=ok, action_error=message, **extra)
    return fragments(request, TEMPLATE, "actions", context, oob=["summary", "detail"])


def _stop_message(outcome: services.StopOutcome, *, takeover: bool) -> str:
    if outcome.already_finished:
        return f"Nothing to stop: the run had already finished ({outcome.status})."
    request = outcome.stop_request
    what = "Take-over" if takeover else "Stop"
    if outcome.created and request is not None:
        return (
            f"{what} recorded ({request.reason}): the entrance is closed and the epoch is now "
            f"{request.epoch_after}."
        )
    if request is not None:
        return f"{what} was already recorded — stop request #{request.pk}, nothing new was done."
    return f"{what} recorded."


@login_required
@require_POST
def run_stop(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)
    form = StopForm(request.POST, admin=request_access(request).can_admin(run.team_id))
    if not form.is_valid():
        return _after_action(request, run_id, error=form_errors(form))
    reason = form.cleaned_data["reason"]
    try:
        outcome = services.run_stop(
            run_id=run.pk, reason=reason, actor=actor_of(request), note=form.cleaned_data["note"]
        )
    except DomainError as error:
        return _after_action(request, run_id, error=error)
    return _after_action(request, run_id, ok=_stop_message(outcome, takeover=False))


@login_required
@require_POST
def run_takeover(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)
    form = NoteForm(request.POST)
    if not form.is_valid():
        return _after_action(request, run_id, error=form_errors(form))
    try:
        outcome = services.run_takeover(
            run_id=run.pk, actor=actor_of(request), note=form.cleaned_data["note"]
        )
    except DomainError as error:
        return _after_action(request, run_id, error=error)
    run.refresh_from_db(fields=["status"])
    if run.status == RunStatus.HANDED_OFF:
        return _after_action(
            request, run_id, ok="Handed off: the run is yours in the handoff inbox."
        )
    return _after_action(
        request,
        run_id,
        ok=_stop_message(outcome, takeover=True)
        + " It will be handed off as soon as it is stopped cleanly.",
    )


@login_required
@require_POST
def run_resume(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)
    detail_labels = list(run.checkpoints.order_by("pk").values_list("label", flat=True))
    form = ResumeForm(request.POST, checkpoints=detail_labels)
    if not form.is_valid():
        return _after_action(request, run_id, error=form_errors(form))
    try:
        resumed = services.run_resume(
            run_id=run.pk,
            actor=actor_of(request),
            checkpoint=form.cleaned_data["checkpoint"],
            carry_over_steering=form.cleaned_data["carry_over_steering"],
        )
    except DomainError as error:
        return _after_action(request, run_id, error=error)
    where = f" from {resumed.resume_from}" if resumed.resume_from else ""
    return _after_action(
        request,
        run_id,
        ok=f"Resumed{where}: pending at epoch {resumed.stop_epoch}, waiting for a worker.",
    )


@login_required
@require_POST
def run_close(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)
    form = NoteForm(request.POST)
    if not form.is_valid():
        return _after_action(request, run_id, error=form_errors(form))
    try:
        services.run_close(run_id=run.pk, actor=actor_of(request), note=form.cleaned_data["note"])
    except DomainError as error:
        return _after_action(request, run_id, error=error)
    return _after_action(request, run_id, ok="Closed: the run is cancelled and will not resume.")


# --------------------------------------------------------------------------------------------
# steering


@login_required
@require_POST
def steering_add(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)
    form = SteeringForm(request.POST)
    url = reverse("console:run", args=[run_id]) + "#steering"
    ok, error = "", ""
    if form.is_valid():
        try:
            message = services.steering_queue(
                run_id=run.pk, text=form.cleaned_data["text"], actor=actor_of(request)
            )
            ok = (
                "Queued for the agent."
                if message.status == "queued"
                else "Saved: the run is stopped, so it waits as unapplied for the next round."
            )
            form = SteeringForm()
        except DomainError as exc:
            error = error_text(exc)
    else:
        error = form_errors(form)
    if not request.htmx:
        return redirect_with(request, url, ok=ok, error=error or None)
    context = run_context(request, run, steering_form=form, steering_ok=ok, steering_error=error)
    return fragments(request, TEMPLATE, "steering-form", context, oob=["detail"])


def _steering_decision(request: HtmxHttpRequest, run: Run, message_id: int) -> tuple[str, str]:
    form = SteeringDecisionForm(request.POST)
    if not form.is_valid():
        return "", form_errors(form)
    carry = form.cleaned_data["decision"] == "carry_over"
    try:
        services.steering_decide(
            run_id=run.pk, message_id=message_id, carry_over=carry, actor=actor_of(request)
        )
    except DomainError as exc:
        return "", error_text(exc)
    return ("Carried over to the next round." if carry else "Discarded."), ""


@login_required
@require_POST
def steering_decide(request: HtmxHttpRequest, run_id: str, message_id: int) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)
    ok, error = _steering_decision(request, run, message_id)
    origin = request.POST.get("from", "")
    if not request.htmx:
        back = (
            reverse("console:handoffs")
            if origin == "handoffs"
            else reverse("console:run", args=[run_id]) + "#steering"
        )
        return redirect_with(request, back, ok=ok, error=error or None)
    if origin == "handoffs":
        from console.views.handoffs import handoff_card_response

        return handoff_card_response(request, run, ok=ok, error=error)
    context = run_context(request, run, detail_ok=ok, detail_error=error)
    return fragments(request, TEMPLATE, "detail", context, oob=["summary"])


# --------------------------------------------------------------------------------------------
# frozen outbox items: release or discard (from the run page or the stop packet)


@login_required
@require_POST
def outbox_decide(
    request: HtmxHttpRequest, run_id: str, item_id: int, decision: str
) -> HttpResponse:
    if decision not in ("release", "discard"):
        raise Http404("no such decision")
    run = run_for(request, run_id, need=Role.REVIEWER)
    item = get_object_or_404(OutboxItem, run=run, pk=item_id)
    note = request.POST.get("note", "")[:500]
    service = services.outbox_release if decision == "release" else services.outbox_discard
    ok, error = "", ""
    try:
        service(run_id=run.pk, item_id=item.pk, actor=actor_of(request), note=note)
        ok = f"{item.public_id} {'released: it will be dispatched' if decision == 'release' else 'discarded'}."
    except DomainError as exc:
        error = error_text(exc)
    origin = request.POST.get("from", "")
    if not request.htmx:
        if origin == "packet":
            back = reverse("console:packet_latest", args=[run_id])
        else:
            back = reverse("console:run", args=[run_id]) + "#outbox"
        return redirect_with(request, back, ok=ok, error=error or None)
    if origin == "packet":
        from console.views.packets import packet_after_change

        return packet_after_change(request, run, ok=ok, error=error)
    context = run_context(request, run, detail_ok=ok, detail_error=error)
    return fragments(request, TEMPLATE, "detail", context, oob=["summary"])
