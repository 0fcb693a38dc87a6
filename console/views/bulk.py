"""Bulk stop from the runs page (DESIGN §12): preview, confirm, and the result page.

1. The runs page posts its ticked rows (or "all matching" with its current filters) to
   `bulk_stop_preview`, which answers how many runs in which states would be stopped, and a
   form with the reason, a note and a fresh idempotency key.
2. That form posts to `bulk_stop_confirm`: one `services.bulk_stop`, then the result page.
3. The result page lists each run's outcome; its rows follow the runs' own frames, so each
   run's status settles live (cancel requested → draining → stopped).

Reviewers only (anyone who may stop somewhere); viewers never see the controls.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.translation import gettext, gettext_lazy
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from console.access import Access, request_access
from console.forms import BulkSelectionForm, BulkStopForm
from console.refusals import refusal_sentence
from console.views.common import (
    HtmxHttpRequest,
    actor_of,
    error_text,
    form_errors,
    fragments,
    page,
    wants_fragment,
)
from runs import selectors as run_selectors
from runs import services
from runs.access import stop_refusals
from runs.errors import BulkTooLarge, DomainError
from runs.models import BulkStop, BulkStopOutcome, Run, RunStatus, StopReason

TEMPLATE = "console/bulk_stop.html"
# Above this many runs the reviewer types the number to confirm (DESIGN §12).
TYPE_TO_CONFIRM = 25
# What a result says now (`run_selectors.bulk_result_state`), as the page words it.
STATE_LABELS = {
    "requested": gettext_lazy("Stop requested"),
    RunStatus.STOPPED_CLEANLY: gettext_lazy("Stopped cleanly"),
    RunStatus.STOPPED_DIRTY: gettext_lazy("Stopped dirty — needs resolution"),
    RunStatus.HANDED_OFF: gettext_lazy("Handed off"),
}
SELECTION_FIELDS = ("scope", "ids", "status", "agent", "team", "q")


def _require_reviewer(request: HtmxHttpRequest) -> Access:
    access = request_access(request)
    if not access.is_reviewer_anywhere:
        raise PermissionDenied(gettext("stopping runs needs the reviewer role"))
    return access


def _refusals(access: Access, reason: str) -> dict[int, str]:
    if access.all_teams:
        return {}
    return stop_refusals(access.team_ids or [], reason=reason, capabilities=access.capabilities)


def _preview_answer(
    request: HtmxHttpRequest,
    access: Access,
    selection: BulkSelectionForm,
    *,
    stop_form: BulkStopForm | None = None,
    error: str = "",
    error_code: str = "",
) -> HttpResponse:
    """The preview with its confirm form (or, for a bad selection, just the error)."""
    preview = None
    if not error and selection.is_valid():
        try:
            preview = services.bulk_stop_preview(
                team_ids=access.team_ids,
                filter=selection.bulk_filter(),
                refusals=_refusals(access, StopReason.USER_STOP),
                actor=actor_of(request),
            )
        except DomainError as refused:
            error = error_text(refused)
    elif not error:
        error = form_errors(selection)
    # The confirm form carries the selection as it was previewed, and one idempotency key per
    # preview: a double click or a resent form answers the first bulk stop.
    source = stop_form.data if stop_form is not None else selection.data
    hidden = [
        (key, value)
        for key in SELECTION_FIELDS
        for value in (source.getlist(key) if hasattr(source, "getlist") else [])
    ]
    limit = services.bulk_stop_limit()
    context: dict[str, Any] = {
        "preview": preview,
        "error": error,
        "stop_form": BulkStopForm(admin=access.is_admin_anywhere),
        "selection": selection.cleaned_data if selection.is_bound and not selection.errors else {},
        "in_dialog": bool(request.htmx),
        "hidden_selection": hidden,
        "idempotency_key": (stop_form.data.get("idempotency_key") if stop_form is not None else "")
        or secrets.token_urlsafe(16),
        "chosen_reason": (stop_form.data.get("reason") if stop_form is not None else "")
        or StopReason.USER_STOP,
        "note": stop_form.data.get("note", "") if stop_form is not None else "",
        "limit": limit,
        "type_to_confirm": preview is not None and preview.will_stop > TYPE_TO_CONFIRM,
        "needs_confirm": (preview is not None and preview.needs_confirm)
        or (stop_form is not None and "bulk_too_large" in error_code),
        # A refused confirm shows its form again, with what was typed.
        "retry": stop_form is not None,
    }
    if wants_fragment(request):
        return fragments(request, TEMPLATE, "preview", context)
    return page(request, TEMPLATE, context, status=400 if error else 200)


@login_required
@require_POST
def bulk_stop_preview(request: HtmxHttpRequest) -> HttpResponse:
    access = _require_reviewer(request)
    return _preview_answer(request, access, BulkSelectionForm(request.POST))


@login_required
@require_POST
def bulk_stop_confirm(request: HtmxHttpRequest) -> HttpResponse:
    access = _require_reviewer(request)
    form = BulkStopForm(request.POST, admin=access.is_admin_anywhere)
    selection = BulkSelectionForm(request.POST)
    if not form.is_valid():
        return _preview_answer(request, access, selection, stop_form=form, error=form_errors(form))
    data = form.cleaned_data
    actor = actor_of(request)
    try:
        if data["preview_id"]:
            shown = run_selectors.bulk_preview_get(actor=actor, preview_id=data["preview_id"])
            if len(shown.run_ids) > TYPE_TO_CONFIRM and data["typed_count"] != len(shown.run_ids):
                return _preview_answer(
                    request,
                    access,
                    selection,
                    stop_form=form,
                    error=_("Type %(count)s, the number of runs to stop, to confirm.")
                    % {"count": len(shown.run_ids)},
                )
        answer = services.bulk_stop(
            preview_id=data["preview_id"],
            actor=actor,
            team_ids=access.team_ids,
            filter=form.bulk_filter(),
            reason=data["reason"],
            note=data["note"],
            idempotency_key=data["idempotency_key"],
            confirm_large=data["confirm_large"],
            refusals=_refusals(access, data["reason"]),
        )
    except BulkTooLarge as refused:
        return _preview_answer(
            request,
            access,
            selection,
            stop_form=form,
            error=refusal_sentence(refused),
            error_code=refused.code,
        )
    except DomainError as refused:
        return _preview_answer(
            request, access, selection, stop_form=form, error=error_text(refused)
        )
    url = reverse("console:bulk_stop", args=[answer.bulk.bulk_id])
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url)


@login_required
@require_GET
def bulk_stop_page(request: HtmxHttpRequest, bulk_id: str) -> HttpResponse:
    """One bulk stop: who, why, which filter, and each run's outcome with its live status.

    Three queries whatever the size: the bulk stop, its results, the runs the user may see. A
    run of a team the user is not in is not listed; ids that named no run only to the person
    who sent them."""
    access = _require_reviewer(request)
    bulk = BulkStop.objects.filter(bulk_id=bulk_id).first()
    if bulk is None:
        raise Http404(gettext("no such bulk stop"))
    results = list(bulk.results.order_by("id"))
    runs = Run.objects.filter(pk__in=[result.run_id for result in results]).select_related("team")
    if not access.all_teams:
        runs = runs.filter(team_id__in=access.team_ids or [])
    visible = {run.pk: run for run in runs}
    mine = bulk.actor_kind == "user" and bulk.actor_id == str(access.user_id)
    rows = [
        (result, visible.get(result.run_id))
        for result in results
        if result.run_id in visible or (mine and result.outcome == BulkStopOutcome.NOT_FOUND)
    ]
    if not rows and not mine:
        raise Http404(gettext("no such bulk stop"))
    labels = {**dict(BulkStopOutcome.choices), **dict(RunStatus.choices), **STATE_LABELS}
    stated = []
    counts: dict[str, int] = {}
    for result, run in rows:
        state = run_selectors.bulk_result_state(result.outcome, run.status if run else None)
        stated.append((result, run, state, labels.get(state, state)))
        counts[state] = counts.get(state, 0) + 1
    context = {
        "bulk": bulk,
        "rows": stated,
        "counts": [(state, labels.get(state, state), n) for state, n in counts.items()],
        "still_stopping": counts.get("requested", 0),
        "hidden": len(results) - len(rows),
    }
    if wants_fragment(request) and request.htmx.target == "bulk-results":
        return fragments(request, TEMPLATE, "results", context)
    return page(request, TEMPLATE, context)
