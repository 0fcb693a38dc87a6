"""The run page, live, and the reviewer actions on it: stop, take over, resume, close, steer.

Page regions (each a `{% partialdef %}` of console/run.html, refreshed by htmx when the run's
websocket says the run changed):
- `summary`: status, epoch, stop reason, lease and heartbeat, the stop progression;
- `actions`: what this user may do now (refreshed only when the status or epoch changes, so a
  half-typed note is not wiped by an unrelated event);
- `detail`: steps, tool calls, outbox, artifacts, checkpoints, steering, this run's ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.translation import gettext
from django.views.decorators.http import require_GET, require_POST

from console.access import request_access, run_for
from console.forms import NoteForm, ResumeForm, SteeringForm, StopForm
from console.selectors.run import checkpoint_labels, run_approvals, run_detail
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
from gateway.models import McpSession
from policies.models import PolicyHit
from runs import services
from runs.labels import label_for
from runs.models import (
    STOPPABLE_STATUSES,
    STOPPED_STATUSES,
    STOPPING_STATUSES,
    TERMINAL_STATUSES,
    Role,
    Run,
    RunStatus,
)
from runs.selectors import (
    approvals_list,
    resume_blocked_reason,
    run_dirty_reasons,
    usage_by_model,
    usage_by_step,
)

TEMPLATE = "console/run.html"


def run_context(request: HtmxHttpRequest, run: Run, **extra: Any) -> dict[str, Any]:
    access = request_access(request)
    detail = run_detail(run, everything=request.GET.get("all") == "1")
    status = run.status
    can_act = access.can_act(run.team_id)
    checkpoints = [checkpoint.label for checkpoint in detail.checkpoints]
    can_resume = status in services.RESUMABLE_STATUSES and status != RunStatus.HANDED_OFF
    # The server refuses a resume while a dirty reason holds; the page says so, in its words.
    reasons = run_dirty_reasons(run) if can_resume else []
    context: dict[str, Any] = {
        "run": run,
        "detail": detail,
        "can_act": can_act,
        "can_admin": access.can_admin(run.team_id),
        "is_stoppable": status in STOPPABLE_STATUSES,
        "is_stopping": status in STOPPING_STATUSES,
        "is_stopped": status in STOPPED_STATUSES,
        "is_terminal": status in TERMINAL_STATUSES,
        "can_resume": can_resume,
        "resume_blocked": resume_blocked_reason(status, reasons) if reasons else "",
        # stopped dirty, or interrupted with an unknown: a person decides before it goes on
        "needs_resolution": status == RunStatus.STOPPED_DIRTY
        or (status == RunStatus.INTERRUPTED and bool(reasons)),
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
        # Lazy: one query, only in the regions that show it (the summary).
        "waiting_approvals": approvals_list(team_ids=None, run_id=run.pk),
        # Every approval the run asked for, decided or not (the detail region's list).
        "run_approvals": SimpleLazyObject(lambda: run_approvals(run)),
        # A run opened through the MCP gateway names its client and upstream (one query).
        "mcp_session": McpSession.objects.filter(run=run).order_by("-started_at").first(),
        "run_tokens": run.input_tokens + run.output_tokens,
        # Lazy too, and read only when the run reported usage.
        "cost_by_model": usage_by_model(run_id=run.pk),
        "cost_by_step": usage_by_step(run_id=run.pk),
        # Lazy: what the team's policies did or would have done on this run (DESIGN §14).
        "policy_hits": PolicyHit.objects.filter(run_id=run.pk).order_by("created_at", "id")[:50],
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
            # So does an interrupted run's: its last unknown resolved (on the packet page) enables
            # Resume without changing the status the page compares.
            also = (
                ["actions"]
                if "actions" in request.GET.get("with", "").split(",")
                or run.status == RunStatus.INTERRUPTED
                else []
            )
            return fragments(request, TEMPLATE, "summary", context, oob=["detail", *also])
        if request.htmx.target == "run-actions":
            return fragments(request, TEMPLATE, "actions", context)
    return page(request, TEMPLATE, context)


def _actions_answer(request: HtmxHttpRequest, run_id: str) -> Callable[[Outcome], HttpResponse]:
    """htmx answer of the run's actions: the new actions region, summary and detail out of band."""

    def answer(outcome: Outcome) -> HttpResponse:
        run = run_for(request, run_id)
        context = run_context(request, run, action_ok=outcome.ok, action_error=outcome.error)
        return fragments(request, TEMPLATE, "actions", context, oob=["summary", "detail"])

    return answer


def _detail_answer(request: HtmxHttpRequest, run: Run) -> Callable[[Outcome], HttpResponse]:
    """htmx answer of a decision in the detail region: the detail, the summary out of band."""

    def answer(outcome: Outcome) -> HttpResponse:
        context = run_context(request, run, detail_ok=outcome.ok, detail_error=outcome.error)
        return fragments(request, TEMPLATE, "detail", context, oob=["summary"])

    return answer


def _run_action(
    request: HtmxHttpRequest,
    run_id: str,
    form: forms.Form,
    service: Callable[[dict[str, Any]], str],
) -> HttpResponse:
    """An action of the actions region, answered on the run page."""
    return act(
        request,
        form=form,
        service=service,
        back=reverse("console:run", args=[run_id]),
        fragment=_actions_answer(request, run_id),
    )


def _stop_message(outcome: services.StopOutcome, *, takeover: bool) -> str:
    if outcome.already_finished:
        return gettext("Nothing to stop: the run had already finished (%(status)s).") % {
            "status": label_for(outcome.status)
        }
    request = outcome.stop_request
    what = gettext("Take-over") if takeover else gettext("Stop")
    if outcome.created and request is not None:
        return gettext(
            "%(what)s recorded (%(reason)s): the entrance is closed and the epoch is now %(epoch_after)s."
        ) % {
            "what": what,
            "reason": label_for(request.reason),
            "epoch_after": request.epoch_after,
        }
    if request is not None:
        return gettext(
            "%(what)s was already recorded — stop request #%(pk)s, nothing new was done."
        ) % {"what": what, "pk": request.pk}
    return gettext("%(what)s recorded.") % {"what": what}


@login_required
@require_POST
def run_stop(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)

    def stop(data: dict[str, Any]) -> str:
        outcome = services.run_stop(
            run_id=run.pk, reason=data["reason"], actor=actor_of(request), note=data["note"]
        )
        return _stop_message(outcome, takeover=False)

    form = StopForm(request.POST, admin=request_access(request).can_admin(run.team_id))
    return _run_action(request, run_id, form, stop)


@login_required
@require_POST
def run_takeover(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)

    def take_over(data: dict[str, Any]) -> str:
        outcome = services.run_takeover(run_id=run.pk, actor=actor_of(request), note=data["note"])
        run.refresh_from_db(fields=["status"])
        if run.status == RunStatus.HANDED_OFF:
            return gettext("Handed off: the run is yours in the handoff inbox.")
        return _stop_message(outcome, takeover=True) + gettext(
            " It will be handed off as soon as it is stopped cleanly."
        )

    return _run_action(request, run_id, NoteForm(request.POST), take_over)


@login_required
@require_POST
def run_resume(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)

    def resume(data: dict[str, Any]) -> str:
        resumed = services.run_resume(
            run_id=run.pk,
            actor=actor_of(request),
            checkpoint=data["checkpoint"],
            carry_over_steering=data["carry_over_steering"],
            note=data["note"],
        )
        where = (
            gettext(" from %(step)s") % {"step": resumed.resume_from} if resumed.resume_from else ""
        )
        return gettext(
            "Resumed%(where)s: pending at epoch %(stop_epoch)s, waiting for a worker."
        ) % {"where": where, "stop_epoch": resumed.stop_epoch}

    form = ResumeForm(request.POST, checkpoints=checkpoint_labels(run_id=run.pk))
    return _run_action(request, run_id, form, resume)


@login_required
@require_POST
def run_close(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)

    def close(data: dict[str, Any]) -> str:
        services.run_close(run_id=run.pk, actor=actor_of(request), note=data["note"])
        return gettext("Closed: the run is cancelled and will not resume.")

    return _run_action(request, run_id, NoteForm(request.POST), close)


# --------------------------------------------------------------------------------------------
# steering


@login_required
@require_POST
def steering_add(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    run = run_for(request, run_id, need=Role.REVIEWER)
    form = SteeringForm(request.POST)

    def queue(data: dict[str, Any]) -> str:
        message = services.steering_queue(run_id=run.pk, text=data["text"], actor=actor_of(request))
        if message.status == "queued":
            return gettext("Queued for the agent.")
        return gettext("Saved: the run is stopped, so it waits as unapplied for the next round.")

    def answer(outcome: Outcome) -> HttpResponse:
        context = run_context(
            request,
            run,
            # A queued message clears the box; a refused one stays for another try.
            steering_form=SteeringForm() if outcome.ok else form,
            steering_ok=outcome.ok,
            steering_error=outcome.error,
        )
        return fragments(request, TEMPLATE, "steering-form", context, oob=["detail"])

    return act(
        request,
        form=form,
        service=queue,
        back=reverse("console:run", args=[run_id]) + "#steering",
        fragment=answer,
    )


# --------------------------------------------------------------------------------------------
# decisions in the detail region (views in console/views/decisions.py, wired in ui_urls.py)

# Release or discard a frozen outbox item; the detail region comes back.
OUTBOX_OFFER = OfferedOn(
    back=lambda run_id: reverse("console:run", args=[run_id]) + "#outbox", answer=_detail_answer
)
# Carry over or discard an unapplied steering message; the detail region comes back.
STEERING_OFFER = OfferedOn(
    back=lambda run_id: reverse("console:run", args=[run_id]) + "#steering", answer=_detail_answer
)
