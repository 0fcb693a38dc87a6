"""Team budgets and team prices (admins): a team's daily and monthly budgets in its time zone,
and its own prices for models the price table lacks. Every change is ledgered by the service.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from console.access import request_access, visible_teams
from console.views.common import HtmxHttpRequest, actor_of, error_text, page, redirect_with
from runs.errors import DomainError
from runs.models import Team, TeamPrice
from runs.selectors import team_budget_spent
from runs.services.team_budgets import (
    PRICE_FIELDS,
    team_budget_set,
    team_price_delete,
    team_price_set,
)

TEMPLATE = "console/budgets.html"


def _admin_teams(request: HtmxHttpRequest) -> list[Team]:
    access = request_access(request)
    if not access.is_admin_anywhere:
        raise PermissionDenied("budgets and prices are managed by team admins")
    return [team for team in visible_teams(access) if access.can_admin(team.pk)]


def _team_rows(teams: list[Team], errors: dict[int, Any]) -> list[dict[str, Any]]:
    now = timezone.now()
    prices = TeamPrice.objects.filter(team__in=teams).order_by("model", "provider")
    by_team: dict[int, list[TeamPrice]] = {}
    for price in prices:
        by_team.setdefault(price.team_id, []).append(price)
    return [
        {
            "team": team,
            "budget": team_budget_spent(team.pk, now=now),
            "prices": by_team.get(team.pk, []),
            "error": errors.get(team.pk, {}),
        }
        for team in teams
    ]


def _render(
    request: HtmxHttpRequest,
    teams: list[Team],
    errors: dict[int, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    return page(
        request,
        TEMPLATE,
        {"rows": _team_rows(teams, errors or {}), "price_fields": PRICE_FIELDS},
        status=status,
    )


def _team(teams: list[Team], slug: str) -> Team:
    team = next((team for team in teams if team.slug == slug), None)
    if team is None:
        raise Http404("no such team")
    return team


@login_required
@require_http_methods(["GET", "POST"])
def budgets(request: HtmxHttpRequest) -> HttpResponse:
    """GET: each administered team's budgets, spend and prices. POST: set one team's budgets."""
    teams = _admin_teams(request)
    if request.method != "POST":
        return _render(request, teams)
    team = _team(teams, request.POST.get("team", ""))
    try:
        team_budget_set(
            team_id=team.pk,
            actor=actor_of(request),
            time_zone=request.POST.get("time_zone", ""),
            daily_usd=request.POST.get("daily_usd", "").strip() or None,
            monthly_usd=request.POST.get("monthly_usd", "").strip() or None,
        )
    except DomainError as exc:
        return _render(request, teams, {team.pk: {"budget": error_text(exc)}}, status=400)
    return redirect_with(
        request,
        reverse("console:team_budget"),
        ok=_("Budget of %(team)s saved.") % {"team": team.slug},
    )


@login_required
@require_POST
def price_save(request: HtmxHttpRequest) -> HttpResponse:
    teams = _admin_teams(request)
    team = _team(teams, request.POST.get("team", ""))
    fields = {name: request.POST.get(name, "").strip() or None for name in PRICE_FIELDS}
    try:
        price = team_price_set(
            team_id=team.pk,
            actor=actor_of(request),
            model=request.POST.get("model", ""),
            provider=request.POST.get("provider", ""),
            **fields,
        )
    except DomainError as exc:
        return _render(request, teams, {team.pk: {"price": error_text(exc)}}, status=400)
    return redirect_with(
        request,
        reverse("console:team_budget"),
        ok=_("Price of %(model)s saved (version %(version)s).")
        % {"model": price.model, "version": price.version},
    )


@login_required
@require_POST
def price_delete(request: HtmxHttpRequest, price_id: int) -> HttpResponse:
    teams = _admin_teams(request)
    price = TeamPrice.objects.filter(pk=price_id, team__in=teams).first()
    if price is None:
        raise Http404("no such price")
    team_price_delete(price_id=price.pk, actor=actor_of(request))
    return redirect_with(
        request,
        reverse("console:team_budget"),
        ok=_("Price of %(model)s removed.") % {"model": price.model},
    )
