"""The audit page (admins): who did what, when and why; CSV export; ledger verification."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from console.access import Access, request_access, visible_teams
from console.forms import AuditFilterForm
from console.selectors.audit import AuditFilters, audit_page
from console.views.common import HtmxHttpRequest, filter_errors, fragments, page, wants_fragment
from notifications.tasks import verify_ledger_soon
from runs.ledger_checks import (
    verification_break,
    verification_is_open,
    verification_last_finished,
    verification_latest,
    verification_request,
)
from runs.ledger_queries import ledger_entries, ledger_entry_team, ledger_filter_choices
from runs.models import Role, Team

TEMPLATE = "console/audit.html"

# The "who stopped what" preset: every action that stops, hands over or settles a run.
STOP_ACTIONS = "run.stop_requested"


def _admin_scope(request: HtmxHttpRequest) -> tuple[Access, list[str] | None, list[Team]]:
    access = request_access(request)
    if not access.is_admin_anywhere:
        raise PermissionDenied("the audit page is for admins")
    admin_ids = access.ids_with(Role.ADMIN)
    teams = visible_teams(access)
    if admin_ids is None:
        return access, None, teams
    teams = [team for team in teams if team.pk in admin_ids]
    return access, [team.slug for team in teams], teams


def _filters(form: AuditFilterForm) -> AuditFilters | None:
    """The filters as typed, or None when one cannot be read (then nothing is shown)."""
    if not form.is_valid():
        return None
    data = form.cleaned_data
    return AuditFilters(
        actor=data.get("actor") or "",
        action=data.get("action") or "",
        reason=data.get("reason") or "",
        team=data.get("team") or "",
        run=data.get("run") or "",
        since=data.get("since"),
        until=data.get("until"),
        after=data.get("after"),
    )


def _typed(form: AuditFilterForm) -> dict[str, Any]:
    """What the person typed, to show back in the fields (the form could not be read)."""
    return {name: form.data.get(name, "") for name in form.fields}


@login_required
@require_GET
def audit(request: HtmxHttpRequest) -> HttpResponse:
    _access, slugs, teams = _admin_scope(request)
    form = AuditFilterForm(request.GET)
    filters = _filters(form)
    rows, has_more = audit_page(slugs, filters) if filters is not None else ([], False)
    actions, reasons = ledger_filter_choices(team_slugs=slugs)
    context = {
        "form": form,
        "filter_errors": filter_errors(form),
        "filters": filters or _typed(form),
        "rows": rows,
        "has_more": has_more,
        "older_after": rows[-1].pk if rows and has_more else None,
        "teams": teams,
        "actions": actions,
        "reasons": reasons,
        "stop_action": STOP_ACTIONS,
        **verification_context(slugs),
    }
    if wants_fragment(request) and request.htmx.target == "audit-region":
        # The export link comes along: it exports what the table now shows (the same query).
        return fragments(request, TEMPLATE, "region", context, oob=["export"])
    return page(request, TEMPLATE, context)


@login_required
@require_http_methods(["GET", "POST"])
def audit_verify(request: HtmxHttpRequest) -> HttpResponse:
    """The latest recorded walk of every hash chain (GET), or ask for a new one (POST). No
    request walks the ledger itself: a big one takes tens of seconds (runs/ledger_checks.py)."""
    _access, slugs, _teams = _admin_scope(request)
    if request.method == "POST":
        verification, created = verification_request(requested_by=request.user.get_username())
        if created:
            transaction.on_commit(lambda: verify_ledger_soon(verification.pk))
        if not request.htmx:
            return redirect("console:audit_verify")  # post/redirect/get without JavaScript
    context = verification_context(slugs)
    if request.htmx:
        return fragments(request, "console/audit_verify.html", "verify", context)
    return page(request, "console/audit_verify.html", context)


def verification_context(slugs: list[str] | None) -> dict[str, Any]:
    """What the "Ledger verification" line shows: the last finished walk (its outcome, when,
    how long) and the one queued or running, if any (then the line polls itself)."""
    latest = verification_latest()
    running = latest if latest is not None and verification_is_open(latest) else None
    last = latest if latest is not None and latest.finished_at else verification_last_finished()
    broken = verification_break(last) if last is not None else None
    in_scope = True
    if broken is not None and slugs is not None:
        in_scope = ledger_entry_team(entry_id=broken.entry_id, run_id=broken.run_id) in slugs
    took = None
    if last is not None and last.started_at is not None and last.finished_at is not None:
        took = (last.finished_at - last.started_at).total_seconds()
    return {
        "verification": {
            "last": last,
            "running": running,
            "broken": broken,
            "in_scope": in_scope,
            "took_seconds": took,
        }
    }


class _Echo:
    def write(self, value: str) -> str:
        return value


# A spreadsheet runs a cell that starts with one of these as a formula (`=HYPERLINK(...)` in a
# note an agent or a reviewer wrote would become a live link, or worse): such a cell is written
# with a leading apostrophe, which spreadsheets show as text and never evaluate.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text. Every CSV export writes its cells through it."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


CSV_COLUMNS = [
    "seq",
    "at",
    "team",
    "run_id",
    "run_seq",
    "actor_kind",
    "actor",
    "action",
    "reason",
    "note",
    "payload",
    "prev_hash",
    "hash",
]


def _csv_rows(entries: Any) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for entry in entries.iterator(chunk_size=2000):
        payload = entry.payload if isinstance(entry.payload, dict) else {}
        row = [
            entry.pk,
            entry.at.isoformat(),
            entry.team_slug,
            entry.run_id or "",
            entry.run_seq,
            entry.actor_kind,
            entry.actor,
            entry.action,
            entry.reason,
            str(payload.get("note", "") or ""),
            json.dumps(entry.payload, sort_keys=True),
            entry.prev_hash,
            entry.hash,
        ]
        yield writer.writerow([spreadsheet_safe(cell) for cell in row])


@login_required
@require_GET
def audit_csv(request: HtmxHttpRequest) -> HttpResponse | StreamingHttpResponse:
    _access, slugs, _teams = _admin_scope(request)
    form = AuditFilterForm(request.GET)
    filters = _filters(form)
    if filters is None:
        # Never the whole ledger for a filter that could not be read: say which, and export nothing.
        lines = [f"{error.label or error.field}: {error.message}" for error in filter_errors(form)]
        return HttpResponse(
            "These filters could not be read; nothing was exported:\n" + "\n".join(lines) + "\n",
            status=400,
            content_type="text/plain; charset=utf-8",
        )
    # The export is the whole filtered ledger, not one page: `after` is not applied.
    entries = ledger_entries(team_slugs=slugs, filters=filters)
    response = StreamingHttpResponse(_csv_rows(entries), content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="safestop-audit-{stamp}.csv"'
    return response
