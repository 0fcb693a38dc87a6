"""`/policies/` (DESIGN §14): a team's policies. Team admins create, edit, delete and test
them against history; viewers and reviewers read them, their errors and their recent hits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.http import Http404, HttpResponse
from django.urls import reverse
from django.utils.translation import gettext as _
from django.views.decorators.http import require_http_methods, require_POST

from console.access import request_access, visible_teams
from console.forms import PolicyForm, PolicyTestForm
from console.refusals import refusal_sentence
from console.views.common import HtmxHttpRequest, act, actor_of, page, redirect_with
from policies.language import CONTEXT
from policies.models import Policy, PolicyHit, PolicyTest
from policies.rule_templates import BY_KEY, TEMPLATES
from policies.services import policy_create, policy_delete, policy_test, policy_update
from runs.errors import DomainError
from runs.models import Team

LIST_TEMPLATE = "console/policies.html"
EDIT_TEMPLATE = "console/policy.html"


@dataclass(frozen=True)
class PolicyRow:
    policy: Policy
    hits: int
    can_edit: bool


def _admin_choices(request: HtmxHttpRequest) -> list[tuple[str, str]]:
    access = request_access(request)
    return [(team.slug, team.slug) for team in visible_teams(access) if access.can_admin(team.pk)]


def _service_error(form: PolicyForm, error: DomainError) -> None:
    field = error.extra.get("field")
    form.add_error(field if field in form.fields else None, refusal_sentence(error))


def _not_saved() -> str:
    return _("The policy was not saved: check the fields marked below.")


def _list_context(request: HtmxHttpRequest, form: PolicyForm | None) -> dict[str, Any]:
    access = request_access(request)
    teams = visible_teams(access)
    policies = (
        Policy.objects.filter(team__in=teams)
        .select_related("team")
        .annotate(hits_total=Count("hits"))
        .order_by("team__slug", "name")
    )
    rows = [
        PolicyRow(policy, policy.hits_total, access.can_admin(policy.team_id))
        for policy in policies
    ]
    return {
        "rows": rows,
        "form": form,
        "can_create": form is not None,
        "templates": TEMPLATES,
        "context_names": [(name, doc) for name, (_kind, doc) in CONTEXT.items()],
    }


@login_required
@require_http_methods(["GET", "POST"])
def policies(request: HtmxHttpRequest) -> HttpResponse:
    choices = _admin_choices(request)
    if request.method != "POST":
        form = None
        if choices:
            template = BY_KEY.get(request.GET.get("template", ""))
            initial = (
                {
                    "name": template.name,
                    "expression": template.expression,
                    "action": template.action,
                }
                if template
                else {}
            )
            form = PolicyForm(teams=choices, initial=initial)
        return page(request, LIST_TEMPLATE, _list_context(request, form))
    if not choices:
        raise PermissionDenied("policies are written by team admins")
    form = PolicyForm(request.POST, teams=choices)
    if form.is_valid():
        team = Team.objects.get(slug=form.cleaned_data["team"])
        try:
            policy = policy_create(team_id=team.pk, actor=actor_of(request), **form.policy_fields())
        except DomainError as exc:
            _service_error(form, exc)
        else:
            return redirect_with(
                request,
                reverse("console:policy", args=[policy.pk]),
                ok=_("Policy %(name)s created.") % {"name": policy.name},
            )
    context = _list_context(request, form)
    return page(request, LIST_TEMPLATE, {**context, "create_error": _not_saved()}, status=400)


def _policy_for(request: HtmxHttpRequest, policy_id: int, *, admin: bool) -> Policy:
    policy = Policy.objects.select_related("team").filter(pk=policy_id).first()
    access = request_access(request)
    if policy is None or not access.can_view(policy.team_id):
        raise Http404("no such policy")
    if admin and not access.can_admin(policy.team_id):
        raise PermissionDenied(f"policies of team {policy.team.slug} are written by its admins")
    return policy


def _edit_context(request: HtmxHttpRequest, policy: Policy) -> dict[str, Any]:
    access = request_access(request)
    return {
        "policy": policy,
        "can_edit": access.can_admin(policy.team_id),
        "hits": PolicyHit.objects.filter(policy=policy).select_related("run")[:20],
        "context_names": [(name, doc) for name, (_kind, doc) in CONTEXT.items()],
        "test_form": PolicyTestForm(),
    }


def _initial(policy: Policy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in PolicyForm.base_fields}


@login_required
@require_http_methods(["GET", "POST"])
def policy_edit(request: HtmxHttpRequest, policy_id: int) -> HttpResponse:
    policy = _policy_for(request, policy_id, admin=request.method == "POST")
    context = _edit_context(request, policy)
    if request.method != "POST":
        return page(
            request, EDIT_TEMPLATE, {**context, "form": PolicyForm(initial=_initial(policy))}
        )
    form = PolicyForm(request.POST)
    if form.is_valid():
        try:
            policy_update(policy_id=policy.pk, actor=actor_of(request), **form.policy_fields())
        except DomainError as exc:
            _service_error(form, exc)
        else:
            return redirect_with(
                request,
                reverse("console:policy", args=[policy.pk]),
                ok=_("Policy %(name)s saved.") % {"name": form.cleaned_data["name"]},
            )
    return page(
        request, EDIT_TEMPLATE, {**context, "form": form, "edit_error": _not_saved()}, status=400
    )


@login_required
@require_POST
def policy_remove(request: HtmxHttpRequest, policy_id: int) -> HttpResponse:
    policy = _policy_for(request, policy_id, admin=True)

    def delete(_data: dict[str, Any]) -> str:
        policy_delete(policy_id=policy.pk, actor=actor_of(request))
        return _("Policy %(name)s deleted.") % {"name": policy.name}

    return act(request, form=None, service=delete, back=reverse("console:policies"), fragment=None)


@login_required
@require_POST
def policy_history_test(request: HtmxHttpRequest, policy_id: int) -> HttpResponse:
    """Test the saved policy against the team's history; the answer on the policy's page."""
    policy = _policy_for(request, policy_id, admin=True)
    context = _edit_context(request, policy)
    form = PolicyTestForm(request.POST)
    context.update(form=PolicyForm(initial=_initial(policy)), test_form=form)
    if not form.is_valid():
        return page(request, EDIT_TEMPLATE, context, status=400)
    try:
        answer = policy_test(
            team=policy.team,
            actor=actor_of(request),
            expression=policy.expression,
            days=form.cleaned_data["days"],
            agent_glob=policy.agent_glob,
            tool_glob=policy.tool_glob,
        )
    except DomainError as exc:
        form.add_error(None, refusal_sentence(exc))
        return page(request, EDIT_TEMPLATE, context, status=400)
    key = "test_queued" if isinstance(answer, PolicyTest) else "test_result"
    return page(request, EDIT_TEMPLATE, {**context, key: answer})
