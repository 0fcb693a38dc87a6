"""Reading the ledger: one query and one set of filter rules for every reader.

The API (`GET /api/v1/ledger/`) and the console's audit page and CSV export both read the
ledger through `ledger_entries`, so a filter means the same thing wherever it is typed:

- `actor`: the exact name the entry was written with (a username or a token's name), surrounding
  blanks ignored. Usernames are case-sensitive ("Bob" and "bob" are two people), and the exact
  match is what `ledger_actor_at_idx` serves.
- `action`: one action (`run.stop_requested`), or every action of a family (`run.*`).
- `run`, `reason`, `team`: exact (`team` is a team slug).
- `since` ≤ `at` < `until`.

Who may read which teams' entries is the caller's business (`runs.access`): the reader passes
the team slugs, or None for every team.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet

from runs.models import LedgerEntry, Run

# The filter menus list at most this many distinct actions and reasons.
CHOICES_LIMIT = 200


@dataclass
class LedgerFilters:
    run: str = ""
    actor: str = ""
    action: str = ""
    reason: str = ""
    team: str = ""  # team slug
    since: datetime | None = None
    until: datetime | None = None


def _scoped(team_slugs: list[str] | None) -> QuerySet[LedgerEntry]:
    # By team slug, not by run: entries without a run (token creation) belong to a team too.
    entries = LedgerEntry.objects.all()
    return entries if team_slugs is None else entries.filter(team_slug__in=team_slugs)


def ledger_entries(
    *, team_slugs: list[str] | None, filters: LedgerFilters
) -> QuerySet[LedgerEntry]:
    """The entries of `team_slugs` (None: every team) that pass `filters`, newest first."""
    entries = _scoped(team_slugs)
    if filters.team:
        entries = entries.filter(team_slug=filters.team)
    if filters.run.strip():
        entries = entries.filter(run_id=filters.run.strip())
    if filters.actor.strip():
        entries = entries.filter(actor=filters.actor.strip())
    if filters.action:
        if filters.action.endswith(".*"):
            entries = entries.filter(action__startswith=filters.action[:-1])
        else:
            entries = entries.filter(action=filters.action)
    if filters.reason:
        entries = entries.filter(reason=filters.reason)
    if filters.since is not None:
        entries = entries.filter(at__gte=filters.since)
    if filters.until is not None:
        entries = entries.filter(at__lt=filters.until)
    return entries.order_by("-pk")


# Entries whose `reason` holds a person's or an agent's own words (a reviewer's message to the
# agent, an agent's suspension text), not a reason code: the Reason menu does not offer them.
FREE_TEXT_REASON_ACTIONS = ("approval.approved", "approval.rejected", "run.suspended")


def ledger_filter_choices(*, team_slugs: list[str] | None) -> tuple[list[str], list[str]]:
    """Distinct actions and reasons in the reader's teams (bounded), for filter menus."""
    entries = _scoped(team_slugs)
    actions = list(
        entries.order_by("action").values_list("action", flat=True).distinct()[:CHOICES_LIMIT]
    )
    reasons = list(
        entries.exclude(reason="")
        .exclude(action__in=FREE_TEXT_REASON_ACTIONS)
        .order_by("reason")
        .values_list("reason", flat=True)
        .distinct()[:CHOICES_LIMIT]
    )
    return actions, reasons


def ledger_entry_team(*, entry_id: int, run_id: str | None = None) -> str | None:
    """The team slug of one entry; for an entry no longer there (a chain cut short, found
    through an anchor), its run's team. None when neither is known."""
    slug = LedgerEntry.objects.filter(pk=entry_id).values_list("team_slug", flat=True).first()
    if slug is None and run_id:
        slug = Run.objects.filter(pk=run_id).values_list("team__slug", flat=True).first()
    return slug
