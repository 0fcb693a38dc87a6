"""Approvals (DESIGN §10): the inbox, one approval's page with its decision, the team's rules,
and the waiting count in the navigation (from `console.views.needs_me.nav`).

- `/approvals/`: the approvals of the user's teams, waiting ones soonest deadline first (a tab
  per decided status), filtered by team, agent, tool and risk. The table is a region refetched
  by htmx when the team socket (the runs page's) announces a change; without JavaScript the
  filter form is a plain GET.
- `/approvals/<id>/`: the run's context, what is held and why, and — for a reviewer while it
  waits — approve, approve with edited arguments, or reject with a message. The status region
  follows the run's socket; once the approval is decided (here, elsewhere, or voided by a stop)
  the decision region is replaced by the outcome.
- `/approvals/rules/`: every member reads the team's rules; team admins create, edit, delete.

Every write goes through a service (`approval_decide`, `approval_rule_*`); a refused one is a
message on the form, never a 500.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext, ngettext
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.access import Access, request_access, visible_teams
from console.forms import APPROVAL_TABS, ApprovalDecisionForm, ApprovalFilterForm, ApprovalRuleForm
from console.refusals import refusal_sentence
from console.selectors.run import run_detail
from console.views.common import (
    DecidableTeams,
    HtmxHttpRequest,
    act,
    actor_of,
    error_text,
    filter_errors,
    form_errors,
    fragments,
    page,
    redirect_with,
    wants_fragment,
)
from runs import frozen, services
from runs.access import Capability
from runs.errors import DomainError, InvalidInput, NotFound
from runs.models import (
    Approval,
    ApprovalRisk,
    ApprovalRule,
    ApprovalStatus,
    ApprovalTarget,
    Role,
    Team,
)
from runs.selectors import approvals_list, approvals_summarised, approvals_waiting_count

INBOX_TEMPLATE = "console/approvals.html"
PAGE_TEMPLATE = "console/approval.html"
RULES_TEMPLATE = "console/approvals_rules.html"
RULE_TEMPLATE = "console/approval_rule.html"

APPROVALS = Capability.APPROVALS

# The inbox shows the soonest deadlines first and stops there: 10,000 waiting approvals must
# render as fast as 10. Filters narrow it.
INBOX_LIMIT = 100
# An approval this close to its deadline is highlighted: it expires — as a rejection — soon.
SOON_SECONDS = 120
# The run's latest steps shown on an approval page: what led to the call.
RECENT_STEPS = 8


# --------------------------------------------------------------------------------------------
# inbox


def _team_scope(access: Access, teams: list[Team], slug: str) -> list[int] | None:
    """The team ids the inbox reads: the filter's team if the user may list its approvals, else
    all of those (None: every team, for staff). The API's list asks the same capability."""
    if slug:
        return [team.pk for team in teams if team.slug == slug and access.may(APPROVALS, team.pk)]
    return access.ids_may(APPROVALS)


def _agents(team_ids: list[int] | None) -> list[str]:
    """The agents with waiting approvals, for the filter (the partial waiting index serves it)."""
    waiting = Approval.objects.filter(status=ApprovalStatus.WAITING)
    if team_ids is not None:
        waiting = waiting.filter(team_id__in=team_ids)
    return list(waiting.order_by("agent").values_list("agent", flat=True).distinct())


@login_required
@require_GET
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    form = ApprovalFilterForm(request.GET)
    readable = form.is_valid()
    data = form.cleaned_data if readable else {}
    tab = data.get("status") or ApprovalStatus.WAITING
    teams = visible_teams(access)
    team_ids = _team_scope(access, teams, data.get("team") or "")
    approvals = approvals_list(
        team_ids=team_ids,
        status="" if tab == "all" else tab,
        agent=data.get("agent") or "",
        tool=data.get("tool") or "",
        risk=data.get("risk") or "",
        run_id=data.get("run") or "",
    )
    # The inbox shows no arguments: never read them (an agent's may be megabytes each).
    approvals = approvals_summarised(approvals, chars=0)
    # A filter that cannot be read shows no approvals (and says why), never every approval.
    rows = list(approvals[: INBOX_LIMIT + 1]) if readable else []
    if not readable:
        data = {key: str(form.data.get(key, ""))[:200] for key in form.fields}
    context = {
        "form": form,
        "filter_errors": filter_errors(form),
        "filters": {key: data.get(key) or "" for key in ("team", "agent", "tool", "risk", "run")},
        "tab": tab,
        "tabs": APPROVAL_TABS,
        "rows": rows[:INBOX_LIMIT],
        "more": len(rows) > INBOX_LIMIT,
        "limit": INBOX_LIMIT,
        "teams": teams,
        "agents": _agents(team_ids),
        "risks": ApprovalRisk.choices,
        "soon_before": timezone.now() + timedelta(seconds=SOON_SECONDS),
        # One COUNT for the navigation and the Waiting tab (and its out-of-band twin).
        "approvals_waiting": approvals_waiting_count(team_ids=access.ids_may(APPROVALS)),
        "filtered": any(data.get(key) for key in ("team", "agent", "tool", "risk", "run")),
        "decide_team_ids": DecidableTeams(access),
    }
    if wants_fragment(request) and request.htmx.target == "approvals-region":
        # The waiting count in the navigation rides along, so it follows the table live.
        return fragments(
            request, INBOX_TEMPLATE, "region", context, oob=["status-input", "nav-count"]
        )
    return page(request, INBOX_TEMPLATE, context)


# --------------------------------------------------------------------------------------------
# one approval


def _approval_for(request: HttpRequest, approval_id: str, *, need: str = Role.VIEWER) -> Approval:
    """The approval, if the user may see its team (else 404) and holds `need` there (else 403)."""
    try:
        pk = services.parse_approval_id(approval_id)
    except NotFound:
        raise Http404(gettext("no such approval")) from None
    approval = (
        Approval.objects.select_related("run", "team", "rule", "execution_record", "outbox_item")
        .filter(pk=pk)
        .first()
    )
    access = request_access(request)
    if approval is None or not access.can_view(approval.team_id):
        raise Http404(gettext("no such approval"))
    if not access.has(approval.team_id, need):
        raise PermissionDenied(
            gettext("you need the %(need)s role on team %(slug)s to decide approvals")
            % {"need": need, "slug": approval.team.slug}
        )
    return approval


def _pretty(value: Any) -> str:
    """The same layout as the editor's (approvals.js): sorted keys, two-space indent."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)


@dataclass(frozen=True)
class DiffLine:
    op: str  # "+", "-", " ", or "…" (the changes left out past DIFF_MAX_LINES)
    text: str


# The changed lines an approval page shows; the rest are counted ("N more changed lines").
DIFF_MAX_LINES = 400
# Past this many lines between the first and last difference, lines are not matched up (a
# SequenceMatcher is quadratic at worst): the old ones are shown removed, the new ones added.
DIFF_MATCH_MAX_LINES = 5000


def _diff_ops(before: list[str], after: list[str]) -> list[tuple[str, str]]:
    """(op, line) for the whole diff: the common head and tail are cut first (linear); the
    middle is matched line by line (no intraline comparison: difflib.ndiff's pairwise scoring
    of replaced blocks is quadratic), or shown as replaced when it is too long to match."""
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    while (
        tail < min(len(before), len(after)) - head
        and before[len(before) - 1 - tail] == after[len(after) - 1 - tail]
    ):
        tail += 1
    old, new = before[head : len(before) - tail], after[head : len(after) - tail]
    ops = [(" ", line) for line in before[:head]]
    if max(len(old), len(new)) > DIFF_MATCH_MAX_LINES:
        ops += [("-", line) for line in old] + [("+", line) for line in new]
    else:
        matcher = difflib.SequenceMatcher(None, old, new)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                ops += [(" ", line) for line in old[i1:i2]]
                continue
            ops += [("-", line) for line in old[i1:i2]] + [("+", line) for line in new[j1:j2]]
    return ops + [(" ", line) for line in before[len(before) - tail :]]


def arguments_diff(before: Any, after: Any) -> list[DiffLine]:
    """A line diff of two argument objects as pretty JSON (what the reviewer changed), linear
    in the common parts and capped at DIFF_MAX_LINES changed lines."""
    lines: list[DiffLine] = []
    shown = hidden = 0
    for op, text in _diff_ops(_pretty(before).splitlines(), _pretty(after).splitlines()):
        if op != " ":
            if shown >= DIFF_MAX_LINES:
                hidden += 1
                continue
            shown += 1
        elif hidden:
            continue
        lines.append(DiffLine(op, text))
    if hidden:
        more = ngettext(
            "%(count)d more changed line not shown",
            "%(count)d more changed lines not shown",
            hidden,
        ) % {"count": hidden}
        lines.append(DiffLine("…", more))
    return lines


def approval_context(
    request: HtmxHttpRequest, approval: Approval, *, full: bool = True, **extra: Any
) -> dict[str, Any]:
    """What the approval page shows. `full` adds the run's recent steps (the page, not the
    regions that its socket refetches)."""
    access = request_access(request)
    waiting = approval.status == ApprovalStatus.WAITING
    context: dict[str, Any] = {
        "approval": approval,
        "run": approval.run,
        "record": approval.execution_record,
        # An approved item the run's stop froze shows frozen before its row is relabelled.
        "item": frozen.present(approval.run, [approval.outbox_item])[0]
        if approval.outbox_item is not None
        else None,
        "is_tool_call": approval.target == ApprovalTarget.TOOL_CALL,
        "waiting": waiting,
        "can_act": access.can_act(approval.team_id),
        "can_decide": waiting and access.can_act(approval.team_id),
        "original_pretty": _pretty(approval.original_arguments),
        "arguments_pretty": _pretty(approval.arguments),
        "diff": arguments_diff(approval.original_arguments, approval.arguments)
        if approval.edited
        else [],
        "schema_pretty": _pretty(approval.arguments_schema) if approval.arguments_schema else "",
        "soon": waiting and approval.deadline <= timezone.now() + timedelta(seconds=SOON_SECONDS),
        "form": None,
        "open_form": "",
    }
    if full:
        detail = run_detail(approval.run)
        context["steps"] = detail.steps[-RECENT_STEPS:]
        context["steps_total"] = detail.steps_total
    context.update(extra)
    return context


@login_required
@require_GET
def approval_page(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    approval = _approval_for(request, approval_id)
    if wants_fragment(request) and request.htmx.target == "approval-status":
        context = approval_context(request, approval)
        # Decided meanwhile (by someone else, by the deadline, or voided by a stop): the forms
        # give way to the outcome. While it waits, a half-typed edit is left alone. The run's
        # steps ride along: the timeline of what led to the call goes on while it waits.
        oob = ["steps"] if context["waiting"] else ["decision", "nav-count", "steps"]
        return fragments(request, PAGE_TEMPLATE, "status", context, oob=oob)
    return page(request, PAGE_TEMPLATE, approval_context(request, approval))


def _decided_message(approval: Approval) -> str:
    if approval.status == ApprovalStatus.APPROVED:
        if approval.edited:
            text = gettext("Approved with your edits: the agent may run %(subject)s now.")
        else:
            text = gettext("Approved as it was: the agent may run %(subject)s now.")
        return text % {"subject": approval.subject}
    return gettext("Rejected: the call will never run; the agent is told why.")


@login_required
@require_POST
def approval_decide(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    approval = _approval_for(request, approval_id, need=Role.REVIEWER)
    url = reverse("console:approval", args=[approval.public_id])
    form = ApprovalDecisionForm(request.POST)
    # Which form to reopen if it fails: the one the reviewer used.
    open_form = "edit" if request.POST.get("arguments", "").strip() else ""
    open_form = open_form or ("reject" if request.POST.get("decision") == "reject" else "approve")
    error, status = "", 200
    if not form.is_valid():
        error, status = form_errors(form), 400
    else:
        try:
            approval = services.approval_decide(
                approval_id=approval.pk,
                decision=form.cleaned_data["decision"],
                actor=actor_of(request),
                message=form.cleaned_data["message"],
                arguments=form.cleaned_data["arguments"],
            )
        except DomainError as exc:
            error, status = error_text(exc), exc.http_status
            if isinstance(exc, InvalidInput) and exc.extra.get("field") in form.fields:
                form.add_error(exc.extra["field"], refusal_sentence(exc))
            elif isinstance(exc, InvalidInput):
                form.add_error(None, refusal_sentence(exc))
    if not error:
        if not request.htmx:
            return redirect_with(request, url, ok=_decided_message(approval))
        approval = _approval_for(request, approval_id)
        context = approval_context(
            request, approval, full=False, decided_ok=_decided_message(approval)
        )
        return fragments(request, PAGE_TEMPLATE, "decision", context, oob=["status", "nav-count"])
    if status == 400:
        # Bad input (nothing was written): the form again, with the reviewer's text and the
        # reason next to it.
        # A reason about the arguments stands under the editor, not twice.
        shown = "" if "arguments" in form.errors else error
        extra: dict[str, Any] = {"form": form, "open_form": open_form, "decision_error": shown}
        if not request.htmx:
            context = approval_context(request, approval, **extra)
            return page(request, PAGE_TEMPLATE, context, status=400)
        context = approval_context(request, approval, full=False, **extra)
        return fragments(request, PAGE_TEMPLATE, "decision", context)
    # Refused (already decided, void, the run no longer running): show what is true now.
    if not request.htmx:
        return redirect_with(request, url, error=error)
    approval = _approval_for(request, approval_id)
    context = approval_context(request, approval, full=False, decision_error=error)
    return fragments(request, PAGE_TEMPLATE, "decision", context, oob=["status", "nav-count"])


# --------------------------------------------------------------------------------------------
# inline decisions: approve as it is, or reject with a message, from a list


def _back_to(request: HttpRequest) -> str:
    """The list the decision was made on (only a path of this site), else the inbox."""
    target = str(request.POST.get("next") or "")
    if target.startswith("/") and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return reverse("console:approvals")


def _inline_outcome(request: HtmxHttpRequest, approval: Approval) -> tuple[Approval, str, str]:
    """Decide through the same form and service as the approval page: (approval, ok, error).
    Arguments never come from a list: approving with edits stays on the approval page."""
    form = ApprovalDecisionForm(
        {"decision": request.POST.get("decision", ""), "message": request.POST.get("message", "")}
    )
    if not form.is_valid():
        return approval, "", form_errors(form)
    try:
        decided = services.approval_decide(
            approval_id=approval.pk,
            decision=form.cleaned_data["decision"],
            actor=actor_of(request),
            message=form.cleaned_data["message"],
            arguments=None,
        )
    except DomainError as exc:
        approval.refresh_from_db()
        return approval, "", error_text(exc)
    return decided, _decided_message(decided), ""


@login_required
@require_POST
def approval_decide_inline(request: HtmxHttpRequest, approval_id: str) -> HttpResponse:
    approval = _approval_for(request, approval_id, need=Role.REVIEWER)
    approval, ok, error = _inline_outcome(request, approval)
    if not request.htmx:
        return redirect_with(request, _back_to(request), ok=ok, error=error or None)
    row_tag = "li" if request.POST.get("row") == "li" else "tr"
    context = {"approval": approval, "ok": ok, "error": error, "row_tag": row_tag}
    html = render_to_string("console/_inline_decided.html", context, request=request)
    return HttpResponse(html)


# --------------------------------------------------------------------------------------------
# rules


def _duration(seconds: int | None) -> str:
    if not seconds:
        return ""
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return gettext("%(n)s min") % {"n": seconds // 60}
    return f"{seconds} s"


@dataclass(frozen=True)
class RuleRow:
    rule: ApprovalRule
    timeout: str
    escalate_after: str
    can_edit: bool


def _admin_teams(access: Access, teams: list[Team]) -> list[Team]:
    return [team for team in teams if access.can_admin(team.pk)]


def _not_saved(form: ApprovalRuleForm) -> str:
    """The line above a refused rule form (each reason stands next to its field)."""
    if any(field != "__all__" for field in form.errors):
        return gettext("The rule was not saved: check the fields marked below.")
    return gettext("The rule was not saved.")


def _service_error(form: ApprovalRuleForm, error: DomainError) -> None:
    """A service's refusal, on the field it names (a bad glob, an unknown transport…)."""
    field = error.extra.get("field")
    form.add_error(field if field in form.fields else None, refusal_sentence(error))


def _rules_context(request: HtmxHttpRequest, form: ApprovalRuleForm | None) -> dict[str, Any]:
    access = request_access(request)
    teams = visible_teams(access)
    admin_ids = {team.pk for team in _admin_teams(access, teams)}
    rules = ApprovalRule.objects.filter(team__in=teams).select_related("team")
    rows = [
        RuleRow(
            rule,
            _duration(rule.timeout_seconds),
            _duration(rule.escalate_after_seconds),
            rule.team_id in admin_ids,
        )
        for rule in rules.order_by("team__slug", "position", "id")
    ]
    return {
        "rows": rows,
        "teams": teams,
        "form": form,
        "can_create": bool(admin_ids),
        "transports": services.TRANSPORTS,
    }


def _team_choices(request: HtmxHttpRequest) -> list[tuple[str, str]]:
    access = request_access(request)
    return [(team.slug, team.slug) for team in _admin_teams(access, visible_teams(access))]


@login_required
@require_http_methods(["GET", "POST"])
def rules(request: HtmxHttpRequest) -> HttpResponse:
    choices = _team_choices(request)
    if request.method != "POST":
        form = ApprovalRuleForm(teams=choices) if choices else None
        return page(request, RULES_TEMPLATE, _rules_context(request, form))
    if not choices:
        raise PermissionDenied(gettext("approval rules are written by team admins"))
    form = ApprovalRuleForm(request.POST, teams=choices)
    if form.is_valid():
        team = Team.objects.get(slug=form.cleaned_data["team"])
        try:
            rule = services.approval_rule_create(
                team_id=team.pk, actor=actor_of(request), **form.rule_fields()
            )
        except DomainError as exc:
            _service_error(form, exc)
        else:
            return redirect_with(
                request,
                reverse("console:approval_rules"),
                ok=gettext("Rule %(repr)s created.") % {"repr": repr(rule.name)},
            )
    context = _rules_context(request, form)
    return page(request, RULES_TEMPLATE, {**context, "create_error": _not_saved(form)}, status=400)


def _rule_for(request: HttpRequest, rule_id: int) -> ApprovalRule:
    """A rule the user's team owns (else 404) that the user administers (else 403)."""
    rule = ApprovalRule.objects.select_related("team").filter(pk=rule_id).first()
    access = request_access(request)
    if rule is None or not access.can_view(rule.team_id):
        raise Http404(gettext("no such rule"))
    if not access.can_admin(rule.team_id):
        raise PermissionDenied(
            gettext("rules of team %(slug)s are written by its admins") % {"slug": rule.team.slug}
        )
    return rule


def _initial(rule: ApprovalRule) -> dict[str, Any]:
    return {name: getattr(rule, name) for name in ApprovalRuleForm.base_fields}


@login_required
@require_http_methods(["GET", "POST"])
def rule_edit(request: HtmxHttpRequest, rule_id: int) -> HttpResponse:
    rule = _rule_for(request, rule_id)
    context: dict[str, Any] = {"rule": rule, "transports": services.TRANSPORTS}
    if request.method != "POST":
        form = ApprovalRuleForm(initial=_initial(rule))
        return page(request, RULE_TEMPLATE, {**context, "form": form})
    form = ApprovalRuleForm(request.POST)
    if form.is_valid():
        try:
            services.approval_rule_update(
                rule_id=rule.pk, actor=actor_of(request), **form.rule_fields()
            )
        except DomainError as exc:
            _service_error(form, exc)
        else:
            return redirect_with(
                request,
                reverse("console:approval_rules"),
                ok=gettext("Rule %(repr)s saved.") % {"repr": repr(form.cleaned_data["name"])},
            )
    return page(
        request,
        RULE_TEMPLATE,
        {**context, "form": form, "edit_error": _not_saved(form)},
        status=400,
    )


@login_required
@require_POST
def rule_delete(request: HtmxHttpRequest, rule_id: int) -> HttpResponse:
    rule = _rule_for(request, rule_id)

    def delete(_data: dict[str, Any]) -> str:
        services.approval_rule_delete(rule_id=rule.pk, actor=actor_of(request))
        return gettext("Rule %(repr)s deleted.") % {"repr": repr(rule.name)}

    return act(
        request,
        form=None,
        service=delete,
        back=reverse("console:approval_rules"),
        fragment=None,
    )
