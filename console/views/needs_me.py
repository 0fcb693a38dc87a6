"""Needs me: one page for everything on the user's teams that waits for a person — approvals
(soonest deadline first), dirty stops and interrupted runs with unconfirmed side effects,
handoffs nobody has accepted — most urgent first, each row linking to the page that decides it.

The list is a region refetched by htmx when the team socket (the runs page's) announces a
change that can add or remove a row; its count rides along into the navigation. Reviewers who
have something waiting land here after signing in (`home`).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.views.decorators.http import require_GET

from console.access import request_access
from console.selectors.needs_me import NEEDS_ME_SOON, NavCounts, nav_counts, needs_me_items
from console.views.common import HtmxHttpRequest, fragments, page, wants_fragment

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


@login_required
@require_GET
def needs_me(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    items = needs_me_items(access)
    counts = _counts(request)
    context = {
        "items": items,
        "can_act_anywhere": access.is_reviewer_anywhere,
        "soon_minutes": int(NEEDS_ME_SOON.total_seconds() // 60),
        "needs_me_count": counts.needs_me,
        "approvals_waiting": counts.approvals_waiting,
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
