"""Needs me: one page for everything on the user's teams that waits for a person — approvals
(soonest deadline first), dirty stops and interrupted runs with unconfirmed side effects,
handoffs nobody has accepted — most urgent first, each row linking to the page that decides it.

The list is grouped by kind — approvals (soonest deadline first), dirty stops, interrupted runs,
handoffs — each group counted in full and shown a page at a time; `?kind=` shows one group and
pages through it (`?page=`). The list is a region refetched by htmx when the team socket (the
runs page's) announces a change that can add or remove a row; the counts ride along into the
navigation, and `nav_counts_fragment` refreshes them on every other page. Reviewers who have
something waiting land here after signing in (`home`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_GET

from console.access import request_access
from console.selectors.needs_me import (
    NEEDS_ME_GROUP_PAGE,
    NEEDS_ME_KINDS,
    NEEDS_ME_SOON,
    NavCounts,
    NeedsMeCounts,
    NeedsMeItem,
    nav_counts,
    needs_me_counts,
    needs_me_group,
)
from console.views.common import DecidableTeams, HtmxHttpRequest, fragments, page, wants_fragment

TEMPLATE = "console/needs_me.html"


def _counts(request: HttpRequest) -> NavCounts:
    """The navigation's counts, read once per request (one query)."""
    cached = getattr(request, "_safestop_nav_counts", None)
    if cached is None:
        cached = nav_counts(request_access(request))
        request._safestop_nav_counts = cached  # type: ignore[attr-defined]
    return cached


def nav(request: HttpRequest) -> dict[str, Any]:
    """Context processor: the counts in the navigation of every page (waiting approvals, what
    needs me). Lazy: the one query runs only when a template shows them (the full pages), never
    for the fragments that htmx refetches."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {}
    return {
        "approvals_waiting": SimpleLazyObject(lambda: _counts(request).approvals_waiting),
        "needs_me_count": SimpleLazyObject(lambda: _counts(request).needs_me),
    }


# The headings of the groups, in the order they are shown (the most time-bound first).
KIND_LABELS = {
    "approval": _("Approvals"),
    "stopped_dirty": _("Dirty stops"),
    "interrupted": _("Interrupted runs"),
    "handoff": _("Handoffs"),
}
# With every kind shown, each group shows its first few; the kind's own view pages through all.
GROUP_PREVIEW = 10


@dataclass(frozen=True)
class Group:
    kind: str
    label: str
    count: int
    items: list[NeedsMeItem]
    page: int
    pages: int

    @property
    def more(self) -> int:
        """How many of this kind the page leaves out."""
        return max(0, self.count - len(self.items))


def _page_number(raw: str) -> int | None:
    """`?page=`: a positive number, else None (an unreadable page shows nothing)."""
    if not raw:
        return 1
    return int(raw) if raw.isdigit() and 0 < int(raw) < 1_000_000 else None


def _groups(request: HtmxHttpRequest, counts: NeedsMeCounts, kind: str, number: int) -> list[Group]:
    access = request_access(request)
    kinds = [kind] if kind else list(NEEDS_ME_KINDS)
    size = NEEDS_ME_GROUP_PAGE if kind else GROUP_PREVIEW
    groups = []
    for each in kinds:
        count = counts.of(each)
        pages = max(1, -(-count // size))
        number_here = min(number, pages)
        items = (
            needs_me_group(access, each, offset=(number_here - 1) * size, limit=size)
            if count
            else []
        )
        groups.append(Group(each, str(KIND_LABELS[each]), count, items, number_here, pages))
    return groups


@login_required
@require_GET
def needs_me(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    kind = request.GET.get("kind", "")
    number = _page_number(request.GET.get("page", ""))
    errors = []
    if kind and kind not in NEEDS_ME_KINDS:
        errors.append(_("Kind: choose one of the kinds listed."))
    if number is None:
        errors.append(_("Page: a page number is a whole number from 1."))
    counts = needs_me_counts(access)
    groups = [] if errors else _groups(request, counts, kind, number or 1)
    nav = _counts(request)
    context = {
        "groups": groups,
        # every row shown, in the order shown
        "items": [item for group in groups for item in group.items],
        "counts": counts,
        "kind": kind if kind in NEEDS_ME_KINDS else "",
        "kinds": [(each, KIND_LABELS[each], counts.of(each)) for each in NEEDS_ME_KINDS],
        "kind_errors": errors,
        "can_act_anywhere": access.is_reviewer_anywhere,
        "decide_team_ids": DecidableTeams(access),
        "soon_minutes": int(NEEDS_ME_SOON.total_seconds() // 60),
        # the badge counts what the groups count: the same querysets, read once here
        "needs_me_count": counts.total,
        "approvals_waiting": nav.approvals_waiting,
    }
    if wants_fragment(request) and request.htmx.target == "needs-me-region":
        # The navigation's counts ride along, so they follow the list live.
        return fragments(
            request, TEMPLATE, "region", context, oob=["nav-needs-count", "nav-approvals-count"]
        )
    return page(request, TEMPLATE, context)


@login_required
@require_GET
def home(request: HtmxHttpRequest) -> HttpResponse:
    """Where signing in lands: a reviewer with anything waiting sees what needs them first;
    everyone else, the runs page."""
    if request_access(request).is_reviewer_anywhere and _counts(request).needs_me:
        return HttpResponseRedirect(reverse("console:needs_me"))
    return HttpResponseRedirect(reverse("console:runs"))


@login_required
@require_GET
def nav_counts_fragment(request: HtmxHttpRequest) -> HttpResponse:
    """The navigation's two counts, out of band: every page asks for them when a frame arrives
    and now and then (a page without a socket too), so the badge follows what waits."""
    counts = _counts(request)
    context = {"needs_me_count": counts.needs_me, "approvals_waiting": counts.approvals_waiting}
    # Only a reviewer's navigation has the Needs me link and its count.
    shown = ["nav-needs-count"] if request_access(request).is_reviewer_anywhere else []
    return fragments(request, TEMPLATE, None, context, oob=[*shown, "nav-approvals-count"])
