"""The MCP upstreams page: the servers `/mcp/<name>/` reaches, per team.

Everyone who can see a team reads its upstreams (names of secrets only); its admins register,
edit and delete them. A secret (a stdio command's env, an HTTP upstream's headers) is taken in
and never shown again: the edit form leaves it as it is unless new values are typed.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.translation import gettext, gettext_lazy
from django.views.decorators.http import require_http_methods, require_POST

from console.access import request_access, visible_teams
from console.refusals import refusal_sentence
from console.views.common import HtmxHttpRequest, act, actor_of, page, redirect_with
from gateway.models import McpUpstream, Transport
from gateway.services import upstream_create, upstream_delete, upstream_update
from runs.errors import DomainError
from runs.models import Team

LIST_TEMPLATE = "console/upstreams.html"
EDIT_TEMPLATE = "console/upstream.html"


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _pairs(text: str, separator: str, field: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in _lines(text):
        name, found, value = line.partition(separator)
        if not found or not name.strip():
            raise forms.ValidationError(
                gettext("%(field)s: every line is NAME%(sep)svalue (%(line)s)")
                % {"field": field, "sep": separator, "line": line[:40]}
            )
        out[name.strip()] = value.strip()
    return out


class UpstreamForm(forms.Form):
    """The fields an edit may change; `UpstreamCreateForm` adds team, name and transport."""

    command = forms.CharField(required=False, max_length=500, label=gettext_lazy("Command"))
    args = forms.CharField(required=False, widget=forms.Textarea, label=gettext_lazy("Arguments"))
    env = forms.CharField(required=False, widget=forms.Textarea, label=gettext_lazy("Environment"))
    url = forms.CharField(required=False, max_length=500, label=gettext_lazy("URL"))
    headers = forms.CharField(required=False, widget=forms.Textarea, label=gettext_lazy("Headers"))
    enabled = forms.BooleanField(required=False, initial=True, label=gettext_lazy("Enabled"))

    def clean_env(self) -> dict[str, str] | None:
        text = self.cleaned_data.get("env", "")
        return _pairs(text, "=", "env") if text.strip() else None

    def clean_headers(self) -> dict[str, str] | None:
        text = self.cleaned_data.get("headers", "")
        return _pairs(text, ":", "headers") if text.strip() else None

    def service_fields(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "command": data.get("command") or "",
            "args": _lines(data.get("args") or ""),
            "env": data.get("env"),
            "url": data.get("url") or "",
            "headers": data.get("headers"),
        }


class UpstreamCreateForm(UpstreamForm):
    team = forms.ChoiceField(label=gettext_lazy("Team"))
    name = forms.CharField(max_length=64, label=gettext_lazy("Name"))
    transport = forms.ChoiceField(choices=Transport.choices, label=gettext_lazy("Transport"))

    def __init__(self, *args: Any, teams: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team = self.fields["team"]
        assert isinstance(team, forms.ChoiceField)
        team.choices = [(slug, slug) for slug in teams]


def _service_error(form: forms.Form, error: DomainError) -> None:
    field = error.extra.get("field")
    form.add_error(field if field in form.fields else None, refusal_sentence(error))


def _context(request: HttpRequest, form: UpstreamCreateForm | None) -> dict[str, Any]:
    access = request_access(request)
    teams = visible_teams(access)
    admin_of = {team.pk for team in teams if access.can_admin(team.pk)}
    upstreams = McpUpstream.objects.filter(team__in=teams).select_related("team")
    return {
        "rows": [(u, u.team_id in admin_of) for u in upstreams.order_by("team__slug", "name")],
        "form": form,
        "can_create": bool(admin_of),
    }


def _admin_slugs(request: HttpRequest) -> list[str]:
    access = request_access(request)
    return [team.slug for team in visible_teams(access) if access.can_admin(team.pk)]


@login_required
@require_http_methods(["GET", "POST"])
def upstreams(request: HtmxHttpRequest) -> HttpResponse:
    slugs = _admin_slugs(request)
    if request.method != "POST":
        form = UpstreamCreateForm(teams=slugs) if slugs else None
        return page(request, LIST_TEMPLATE, _context(request, form))
    if not slugs:
        raise PermissionDenied(gettext("MCP upstreams are registered by team admins"))
    form = UpstreamCreateForm(request.POST, teams=slugs)
    if form.is_valid():
        data = form.cleaned_data
        try:
            upstream = upstream_create(
                team=Team.objects.get(slug=data["team"]),
                name=data["name"],
                transport=data["transport"],
                actor=actor_of(request),
                **form.service_fields(),
            )
        except DomainError as error:
            _service_error(form, error)
        else:
            return redirect_with(
                request,
                reverse("console:mcp_upstreams"),
                ok=gettext("Upstream %(name)s registered: agents connect to /mcp/%(name)s/.")
                % {"name": upstream.name},
            )
    context = {**_context(request, form), "create_error": gettext("The upstream was not saved.")}
    return page(request, LIST_TEMPLATE, context, status=400)


def _upstream_for(request: HttpRequest, upstream_id: int) -> McpUpstream:
    """An upstream of a team the user sees (else 404) and administers (else 403)."""
    upstream = McpUpstream.objects.select_related("team").filter(pk=upstream_id).first()
    access = request_access(request)
    if upstream is None or not access.can_view(upstream.team_id):
        raise Http404("no such upstream")
    if not access.can_admin(upstream.team_id):
        raise PermissionDenied(gettext("upstreams are changed by the team's admins"))
    return upstream


@login_required
@require_http_methods(["GET", "POST"])
def upstream_edit(request: HtmxHttpRequest, upstream_id: int) -> HttpResponse:
    upstream = _upstream_for(request, upstream_id)
    if request.method != "POST":
        form = UpstreamForm(
            initial={
                "command": upstream.command,
                "args": "\n".join(upstream.args),
                "url": upstream.url,
                "enabled": upstream.enabled,
            }
        )
        return page(request, EDIT_TEMPLATE, {"upstream": upstream, "form": form})
    form = UpstreamForm(request.POST)
    if form.is_valid():
        try:
            upstream_update(
                upstream_id=upstream.pk,
                team_ids=[upstream.team_id],
                actor=actor_of(request),
                enabled=form.cleaned_data["enabled"],
                **form.service_fields(),
            )
        except DomainError as error:
            _service_error(form, error)
        else:
            return redirect_with(
                request,
                reverse("console:mcp_upstreams"),
                ok=gettext("Upstream %(name)s saved.") % {"name": upstream.name},
            )
    context = {
        "upstream": upstream,
        "form": form,
        "edit_error": gettext("The upstream was not saved."),
    }
    return page(request, EDIT_TEMPLATE, context, status=400)


@login_required
@require_POST
def upstream_remove(request: HtmxHttpRequest, upstream_id: int) -> HttpResponse:
    upstream = _upstream_for(request, upstream_id)

    def delete(_data: dict[str, Any]) -> str:
        upstream_delete(
            upstream_id=upstream.pk, team_ids=[upstream.team_id], actor=actor_of(request)
        )
        return gettext("Upstream %(name)s deleted.") % {"name": upstream.name}

    return act(
        request, form=None, service=delete, back=reverse("console:mcp_upstreams"), fragment=None
    )
