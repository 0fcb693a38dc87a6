"""API tokens (admins): list the team's tokens, make one (shown once), revoke one."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.cache import add_never_cache_headers
from django.utils.translation import gettext
from django.views.decorators.http import require_http_methods, require_POST

from console.access import request_access, require, visible_teams
from console.forms import TokenCreateForm
from console.selectors.tokens import api_token_get, api_tokens_of
from console.views.common import (
    HtmxHttpRequest,
    act,
    actor_of,
    error_text,
    form_errors,
    page,
)
from runs.errors import DomainError
from runs.models import Role, Team
from runs.tokens import api_token_create, api_token_revoke

TEMPLATE = "console/tokens.html"
NEW_TOKEN_KEY = "console.new_token"


def _admin_teams(request: HtmxHttpRequest) -> list[Team]:
    access = request_access(request)
    if not access.is_admin_anywhere:
        raise PermissionDenied(gettext("tokens are managed by team admins"))
    return [team for team in visible_teams(access) if access.can_admin(team.pk)]


def _context(teams: list[Team], form: TokenCreateForm, **extra: object) -> dict[str, object]:
    return {"teams": teams, "form": form, "tokens": api_tokens_of(teams=teams), **extra}


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HtmxHttpRequest) -> HttpResponse:
    teams = _admin_teams(request)
    choices = [(team.slug, team.slug) for team in teams]
    if request.method != "POST":
        # The token made by the POST before this redirect: shown on this one page, then gone.
        shown = request.session.pop(NEW_TOKEN_KEY, None)
        new_token = None
        if isinstance(shown, dict):
            new_token = next(
                (token for token in api_tokens_of(teams=teams) if token.pk == shown.get("id")),
                None,
            )
        if new_token is None:
            return page(request, TEMPLATE, _context(teams, TokenCreateForm(teams=choices)))
        response = page(
            request,
            TEMPLATE,
            _context(
                teams, TokenCreateForm(teams=choices), new_token=new_token, raw_token=shown["raw"]
            ),
        )
        add_never_cache_headers(response)  # Back must not bring the secret out of a cache
        return response
    form = TokenCreateForm(request.POST, teams=choices)
    if not form.is_valid():
        return page(
            request, TEMPLATE, _context(teams, form, create_error=form_errors(form)), status=400
        )
    team = next(team for team in teams if team.slug == form.cleaned_data["team"])
    require(request, team.pk, Role.ADMIN)
    try:
        token, raw = api_token_create(
            team_slug=team.slug,
            name=form.cleaned_data["name"],
            role=form.cleaned_data["role"],
            actor=actor_of(request),
        )
    except DomainError as exc:
        return page(
            request, TEMPLATE, _context(teams, form, create_error=error_text(exc)), status=400
        )
    # Post/redirect/get, so a refresh does not post again. The raw token never goes into a URL:
    # it waits in the session for the one page that shows it, which takes it out.
    request.session[NEW_TOKEN_KEY] = {"id": token.pk, "raw": raw}
    return HttpResponseRedirect(reverse("console:tokens"))


@login_required
@require_POST
def token_revoke(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    teams = _admin_teams(request)
    token = api_token_get(token_id=token_id, teams=teams)
    if token is None:
        raise Http404(gettext("no such token"))

    def revoke(_data: dict[str, Any]) -> str:
        api_token_revoke(token_id=token.pk, actor=actor_of(request))
        return gettext("Token %(name)s revoked.") % {"name": token.name}

    return act(request, form=None, service=revoke, back=reverse("console:tokens"), fragment=None)
