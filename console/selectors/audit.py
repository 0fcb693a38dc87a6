"""The audit page."""

from __future__ import annotations

from dataclasses import dataclass

from runs.ledger_queries import LedgerFilters, ledger_entries
from runs.models import (
    LedgerEntry,
)

AUDIT_PAGE_SIZE = 100


@dataclass
class AuditFilters(LedgerFilters):
    """The ledger's filters (`runs.ledger_queries`, shared with the API) and the page cursor."""

    after: int | None = None  # keyset: entries with id < after


def audit_page(
    team_slugs: list[str] | None, filters: AuditFilters, *, size: int = AUDIT_PAGE_SIZE
) -> tuple[list[LedgerEntry], bool]:
    """One page of the filtered ledger, newest first, older than `filters.after`; and whether
    there is more (one query: the page plus one row)."""
    entries = ledger_entries(team_slugs=team_slugs, filters=filters)
    if filters.after:
        entries = entries.filter(pk__lt=filters.after)
    rows = list(entries[: size + 1])
    return rows[:size], len(rows) > size
