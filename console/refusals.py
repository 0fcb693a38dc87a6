"""A domain refusal in the reader's words.

A `DomainError`'s `detail` is an English sentence built where the refusal happens, for the API
and the logs; the console shows it as it is to a reader of English. Any other reader gets the
sentence this table keeps for the error's stable `code`, filled with the values the error
carries (its `extra`, its run's stop epoch). The API keeps answering the code and the English
detail: only what a person reads on a console page is translated here.

Each code maps to its sentences from the most to the least specific; the first whose named
values the error carries is used, so an error raised without (say) an assignee still reads
whole. A code missing here reads as the generic refusal (`tests/i18n` fails on a missing one).
"""

from __future__ import annotations

import re
from typing import Any

from django.utils.functional import Promise
from django.utils.translation import get_language, gettext
from django.utils.translation import gettext_lazy as _

from runs.errors import DomainError

REFUSALS: dict[str, tuple[Promise, ...]] = {
    "domain_error": (_("The action was refused."),),
    "stale_epoch": (
        _(
            "This belongs to an earlier epoch: the run was stopped or moved on since "
            "(it is at epoch %(stop_epoch)s now)."
        ),
        _("This belongs to an earlier epoch: the run was stopped or moved on since."),
    ),
    "run_not_running": (_("The run is not running, so this cannot be done now."),),
    "lease_held": (_("Another worker holds the run's lease."),),
    "lease_revoked": (_("The worker's lease was released or revoked."),),
    "illegal_transition": (_("This cannot be done in the run's current state."),),
    "tool_call_conflict": (
        _(
            "Tool call %(tool_call_id)s was first asked for another tool or other arguments; "
            "this one was granted nothing."
        ),
        _("This tool call id was first asked for another call; this one was granted nothing."),
    ),
    "already_finished": (_("The run had already finished."),),
    "budget_exhausted": (_("The budget is used up."),),
    "not_found": (_("Not found: it does not exist, or no longer exists."),),
    "invalid": (
        _("The expression does not compile (line %(line)s, column %(column)s)."),
        _("This value is not accepted: check it and try again."),
    ),
    "forbidden": (_("You may not do this."),),
    "already_decided": (_("This approval was already decided."),),
    "approval_void": (
        _(
            "This approval was voided: the run was stopped, taken over, interrupted or lost "
            "its lease."
        ),
    ),
    "approval_closed": (_("This approval is closed: it was rejected, expired or voided."),),
    "approval_rate_limited": (
        _(
            "The team asked for %(limit)s approvals in the last minute, the most it may; nothing "
            "was held. Try again shortly."
        ),
        _("The team asked for too many approvals in the last minute; try again shortly."),
    ),
    "bulk_too_large": (
        _(
            "This would stop %(would_stop)s runs, more than %(limit)s at once: confirm to stop "
            "them all."
        ),
        _("This would stop more runs than the limit at once: confirm to stop them all."),
    ),
    "preview_expired": (_("This preview is too old: preview again."),),
    "handoff_assigned": (
        _("Assigned to %(assignee)s: confirm to take it from them."),
        _("Assigned to someone else: confirm to take it from them."),
    ),
    # Edited arguments (the approval page's editor) and an agent's arguments schema.
    "arguments_too_deep": (_("The arguments are nested too deeply."),),
    "arguments_too_large": (_("The arguments are too large."),),
    "arguments_check_timeout": (
        _(
            "Checking the arguments against the agent's schema took too long and was stopped; "
            "approve the original arguments, or reject."
        ),
    ),
    "arguments_check_failed": (
        _(
            "The arguments could not be checked against the agent's schema; approve the "
            "original arguments, or reject."
        ),
    ),
    "schema_invalid": (_("The agent's arguments schema is not a valid JSON Schema."),),
    "schema_too_large": (_("The agent's arguments schema is too large to check."),),
    "schema_unsupported": (_("The agent's arguments schema uses something not supported."),),
    "schema_unsupported_pattern": (
        _("The agent's arguments schema has a pattern that is not supported."),
    ),
    "schema_remote_ref": (_("The agent's arguments schema refers outside itself."),),
    "schema_bad_ref": (_("The agent's arguments schema refers to nothing."),),
    "schema_ref_loop": (_("The agent's arguments schema refers to itself in a loop."),),
}

_NAMED = re.compile(r"%\((\w+)\)")


def _values(error: DomainError) -> dict[str, Any]:
    values = {name: value for name, value in error.extra.items() if value not in (None, "")}
    if error.stop_epoch is not None:
        values["stop_epoch"] = error.stop_epoch
    return values


def _reads_in_english() -> bool:
    return (get_language() or "en").startswith("en")


def refusal_sentence(error: DomainError) -> str:
    """The refusal as one sentence in the active language, without the run's state."""
    if _reads_in_english():
        return error.detail
    values = _values(error)
    for sentence in REFUSALS.get(error.code, REFUSALS["domain_error"]):
        text = str(sentence)
        if set(_NAMED.findall(text)) <= values.keys():
            return text % values
    return gettext("The action was refused.")
