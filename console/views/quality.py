"""Stop quality (DESIGN §7): the five figures over a chosen period, with server-drawn charts."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from console.access import request_access, visible_teams
from console.forms import QualityPeriodForm
from console.selectors.quality import quality_series
from console.views.common import HtmxHttpRequest, fragments, page, wants_fragment
from handoff.selectors import stop_quality

TEMPLATE = "console/quality.html"


@login_required
@require_GET
def quality(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    form = QualityPeriodForm(request.GET or None)
    since, until, label = form.window()
    teams = visible_teams(access)
    team_slug = form.cleaned_data.get("team", "") if form.is_bound and form.is_valid() else ""
    team_ids = access.team_ids
    chosen = next((team for team in teams if team.slug == team_slug), None)
    if chosen is not None:
        team_ids = [chosen.pk]
    figures = stop_quality(since=since, until=until, team_ids=team_ids)
    series = quality_series(since=since, until=until, team_ids=team_ids)
    asked = request.GET
    context = {
        "form": form,
        # From/To show only for a custom period (dates without a period are one too).
        "custom_period": asked.get("period") == "custom"
        or (not asked.get("period") and bool(asked.get("since") and asked.get("until"))),
        "figures": figures,
        "series": series,
        "since": since,
        "until": until,
        "period_label": label,
        "teams": teams,
        "team": chosen,
    }
    if wants_fragment(request) and request.htmx.target == "quality-region":
        return fragments(request, TEMPLATE, "region", context)
    return page(request, TEMPLATE, context)
