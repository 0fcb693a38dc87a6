"""The runs page: a live table with counts per state, filters, search and keyset pagination."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from console.access import request_access, visible_teams
from console.forms import RunFilterForm
from console.selectors.runs import RunFilters, RunsPage, runs_page
from console.views.common import (
    HtmxHttpRequest,
    filter_errors,
    fragments,
    page,
    wants_fragment,
)
from runs.models import STOPPABLE_STATUSES, Role, RunStatus
from runs.selectors import approvals_waiting_by_run

TEMPLATE = "console/runs.html"

# Order of the state chips: where attention is needed first, then the live ones, then the rest.
STATE_ORDER = [
    RunStatus.STOPPED_DIRTY,
    RunStatus.CANCEL_REQUESTED,
    RunStatus.DRAINING,
    RunStatus.INTERRUPTED,
    RunStatus.RUNNING,
    RunStatus.PENDING,
    RunStatus.SUSPENDED,
    RunStatus.HANDED_OFF,
    RunStatus.STOPPED_CLEANLY,
    RunStatus.COMPLETED,
    RunStatus.FAILED,
    RunStatus.CANCELLED,
]


@login_required
@require_GET
def runs_list(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    form = RunFilterForm(request.GET)
    readable = form.is_valid()
    data = form.cleaned_data if readable else form.data
    filters = RunFilters(
        **{
            key: str(data.get(key) or "")[:200]
            for key in ("status", "agent", "team", "q", "after", "before")
        }
    )
    teams = visible_teams(access)
    # A filter that cannot be read shows no runs (and says why), never every run.
    result = (
        runs_page(access, filters, teams=teams)
        if readable
        else RunsPage(rows=[], counts={}, total=0, has_newer=False, has_older=False, teams=teams)
    )
    state_counts = [
        (state, RunStatus(state).label, result.counts.get(state, 0)) for state in STATE_ORDER
    ]
    stoppable_count, stoppable_label = _stoppable(result, filters.status)
    context = {
        "matching_count": stoppable_count,
        "matching_label": stoppable_label,
        "form": form,
        "filter_errors": filter_errors(form),
        "filters": filters,
        "result": result,
        "state_counts": state_counts,
        "status_choices": RunStatus.choices,
        "waiting_by_run": approvals_waiting_by_run([run.pk for run in result.rows]),
        # Bulk stop (DESIGN §12): checkboxes for reviewers, on the rows of teams they may stop.
        "can_bulk_stop": access.is_reviewer_anywhere,
        "bulk_team_ids": access.ids_with(Role.REVIEWER),  # None: every team
    }
    if wants_fragment(request) and request.htmx.target == "runs-region":
        # The table region only: the filter form is the page's one copy of the query (a chip
        # sets its field and submits it, console.js), so nothing here rewrites the form.
        return fragments(request, TEMPLATE, "region", context)
    return page(request, TEMPLATE, context)


def _stoppable(result: RunsPage, status: str) -> tuple[int, str]:
    """How many of the runs the filters select a stop would change (pending, running, suspended
    or interrupted), and that as the page words it: "1000+" once a count reached its cap.
    Finished and already-stopping runs are not counted: the button promises what it will do."""
    states = [status] if status else sorted(STOPPABLE_STATUSES)
    states = [state for state in states if state in STOPPABLE_STATUSES]
    count = sum(result.counts.get(state, 0) for state in states)
    capped = any(state in result.capped for state in states)
    return count, f"{count}{'+' if capped else ''}"
