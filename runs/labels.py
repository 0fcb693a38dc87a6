"""Codes as words: the console shows a state or a reason (`stopped_dirty`, `lease_expired`) in
the reader's language; the code itself stays English everywhere else (API, ledger, exports).

A code missing here is shown as itself with spaces for underscores, so a new code is never
hidden, only untranslated until it is added (the zh-Hans page test finds it).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from django.utils.translation import gettext, pgettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

LABELS: dict[str, Any] = {
    # run states
    "pending": pgettext_lazy("state", "pending"),
    "running": pgettext_lazy("state", "running"),
    "suspended": pgettext_lazy("state", "suspended"),
    "interrupted": pgettext_lazy("state", "interrupted"),
    "cancel_requested": pgettext_lazy("state", "cancel requested"),
    "draining": pgettext_lazy("state", "draining"),
    "stopped_cleanly": pgettext_lazy("state", "stopped cleanly"),
    "stopped_dirty": pgettext_lazy("state", "stopped dirty"),
    "handed_off": pgettext_lazy("state", "handed off"),
    "completed": pgettext_lazy("state", "completed"),
    "failed": pgettext_lazy("state", "failed"),
    "cancelled": pgettext_lazy("state", "cancelled"),
    # execution, side effect, outbox, step, steering, handoff, lease, approval states
    "permitted": pgettext_lazy("state", "permitted"),
    "succeeded": pgettext_lazy("state", "succeeded"),
    "not_started": pgettext_lazy("state", "not started"),
    "unknown": pgettext_lazy("state", "unknown"),
    "none": pgettext_lazy("state", "none"),
    "pending_verification": pgettext_lazy("state", "pending verification"),
    "applied": pgettext_lazy("state", "applied"),
    "not_applied": pgettext_lazy("state", "not applied"),
    "compensated": pgettext_lazy("state", "compensated"),
    "not_requested": pgettext_lazy("state", "not requested"),
    "requested": pgettext_lazy("state", "requested"),
    "confirmed": pgettext_lazy("state", "confirmed"),
    "refused": pgettext_lazy("state", "refused"),
    "dispatching": pgettext_lazy("state", "dispatching"),
    "sent": pgettext_lazy("state", "sent"),
    "sending": pgettext_lazy("state", "sending"),
    "frozen": pgettext_lazy("state", "frozen"),
    "released": pgettext_lazy("state", "released"),
    "discarded": pgettext_lazy("state", "discarded"),
    "planned": pgettext_lazy("state", "planned"),
    "queued": pgettext_lazy("state", "queued"),
    "unapplied_at_stop": pgettext_lazy("state", "unapplied at stop"),
    "carried_over": pgettext_lazy("state", "carried over"),
    "open": pgettext_lazy("state", "open"),
    "accepted": pgettext_lazy("state", "accepted"),
    "returned": pgettext_lazy("state", "returned"),
    "closed": pgettext_lazy("state", "closed"),
    "live": pgettext_lazy("state", "live"),
    "revoked_by_stop": pgettext_lazy("state", "revoked by stop"),
    "expired": pgettext_lazy("state", "expired"),
    "waiting": pgettext_lazy("state", "waiting"),
    "approved": pgettext_lazy("state", "approved"),
    "rejected": pgettext_lazy("state", "rejected"),
    "void": pgettext_lazy("state", "void"),
    "awaiting_approval": pgettext_lazy("state", "awaiting approval"),
    "stopped": pgettext_lazy("state", "stopped"),
    # roles and actors
    "viewer": pgettext_lazy("role", "viewer"),
    "reviewer": pgettext_lazy("role", "reviewer"),
    "admin": pgettext_lazy("role", "admin"),
    "agent": pgettext_lazy("role", "agent"),
    "user": pgettext_lazy("actor", "user"),
    "api_client": pgettext_lazy("actor", "API client"),
    "system": pgettext_lazy("actor", "system"),
    # stop and interruption reasons
    "user_stop": _("user stop"),
    "admin_kill": _("admin kill"),
    "manual_takeover": _("manual takeover"),
    "timeout": _("timeout"),
    "budget_exhausted": _("budget exhausted"),
    "lease_expired": _("lease expired"),
    "drain_deadline": _("drain deadline"),
    "dependency_failure": _("dependency failure"),
    "external_action": _("external action"),
    "policy": _("policy"),
    "policy_violation": _("policy violation"),
    "unconfirmed_side_effects": _("unconfirmed side effects"),
    "outbox_in_flight": _("outbox items in flight"),
    "worker_unconfirmed": _("worker unconfirmed"),
    "lease_expired_during_drain": _("lease expired during drain"),
    "worker_ack": _("worker acknowledged"),
    "worker_released": _("worker released"),
    "no_live_lease": _("no live lease"),
    "dispatch_deadline": _("dispatch deadline"),
    "all_unknowns_resolved": _("all unknowns resolved"),
    "human_completed": _("completed by a person"),
    "already_finished": _("already finished"),
    "already_stopped": _("already stopped"),
    "already_stopping": _("already stopping"),
    "not_allowed": _("not allowed"),
    "not_found": _("not found"),
    "asked by the agent": _("asked by the agent"),
    "asked_by_agent": _("asked by the agent"),
    "hour": pgettext_lazy("per", "hour"),
    "day": pgettext_lazy("per", "day"),
    "week": pgettext_lazy("per", "week"),
    # approval targets, risks, rule side effects
    "tool_call": _("tool call"),
    "outbox": _("outbox item"),
    "any": _("tool calls and outbox items"),
    "write": _("write"),
    "low": pgettext_lazy("risk", "low"),
    "medium": pgettext_lazy("risk", "medium"),
    "high": pgettext_lazy("risk", "high"),
    # resolutions
    "manual_confirmation": _("manual confirmation"),
    "compensate": _("compensate"),
    "query_original": _("query the original operation"),
    "reuse_idempotency_key": _("reuse the idempotency key"),
    # transports
    "email": _("e-mail"),
    "webhook": _("webhook"),
    "slack": _("Slack"),
}


def label_for(value: Any) -> str:
    """The reader's words for a code; an unknown code with spaces for its underscores."""
    code = str(value or "")
    label = LABELS.get(code)
    return str(label) if label is not None else code.replace("_", " ")


# What a matched approval rule stored as the approval's reason (`Approval.match_reason`, the
# ledger's `why`), in English, as `runs.services.approvals` writes it:
# "rule 'payments' matched tool 'charge_*', side effect 'write'" or "rule 'x' matched everything".
# The stored text stays as it is (API, ledger, exports); a reader sees it rebuilt in their words.
_QUOTED = r"'(?:[^'\\]|\\.)*'" + "|" + r'"(?:[^"\\]|\\.)*"'
_RULE_MATCHED = re.compile(rf"rule (?P<name>{_QUOTED}) matched (?P<what>.*)", re.S)
_MATCH_PART = re.compile(
    rf"(?P<label>tool|side effect|agent|transport|destination) (?P<value>{_QUOTED})"
)
_MATCH_LABELS = {
    "tool": pgettext_lazy("rule match", "tool %(value)s"),
    "side effect": pgettext_lazy("rule match", "side effect %(value)s"),
    "agent": pgettext_lazy("rule match", "agent %(value)s"),
    "transport": pgettext_lazy("rule match", "transport %(value)s"),
    "destination": pgettext_lazy("rule match", "destination %(value)s"),
}


def _match_parts(what: str) -> list[str] | None:
    """Each `label 'value'` of a stored match, in the reader's words; None if it does not read."""
    parts: list[str] = []
    position = 0
    while position < len(what):
        found = _MATCH_PART.match(what, position)
        if found is None:
            return None
        value = found["value"]
        if found["label"] == "side effect":
            value = f"'{label_for(ast.literal_eval(value))}'"
        parts.append(str(_MATCH_LABELS[found["label"]]) % {"value": value})
        position = found.end()
        if what.startswith(", ", position):
            position += 2
        elif position != len(what):
            return None
    return parts


def approval_reason_text(stored: str) -> str:
    """Why an approval waits, in the reader's language: the stored rule match rebuilt from its
    parts, the agent's own ask as its label; anything else (an older wording) as it was stored."""
    text = str(stored or "")
    if text in LABELS:
        return label_for(text)
    matched = _RULE_MATCHED.fullmatch(text)
    if matched is None:
        return text
    what = matched["what"]
    parts = [] if what == "everything" else _match_parts(what)
    if parts is None:
        return text
    return gettext("rule %(name)s matched %(what)s") % {
        "name": matched["name"],
        "what": pgettext("list separator", ", ").join(parts)
        if parts
        else pgettext("rule match", "everything"),
    }


# The notes the server writes on a stop it makes itself (runs/budgets.py, policies/evaluate.py,
# the permit's budget check, a voided approval), stored in English like every record and
# rebuilt here in the reader's words; a note a person typed is shown as typed.
_SYSTEM_NOTES: list[tuple[re.Pattern[str], Any]] = [
    (
        re.compile(r"budget (?P<name>\S+) exhausted: (?P<used>.+?) of (?P<limit>.+)", re.S),
        lambda m: (
            gettext("budget %(name)s exhausted: %(used)s of %(limit)s")
            % {"name": m["name"], "used": _units(m["used"]), "limit": _units(m["limit"])}
        ),
    ),
    (
        re.compile(r"policy (?P<name>\S+) matched: (?P<expression>.*?) — saw (?P<values>.*)", re.S),
        lambda m: (
            gettext("policy %(name)s matched: %(expression)s — saw %(values)s")
            % {"name": m["name"], "expression": m["expression"], "values": m["values"]}
        ),
    ),
    (
        re.compile(
            r"policy (?P<name>\S+) evaluation error \((?P<error>.*?)\); on_error stops: "
            r"(?P<expression>.*?) — saw (?P<values>.*)",
            re.S,
        ),
        lambda m: (
            gettext(
                "policy %(name)s could not be evaluated (%(error)s) and stops on error: "
                "%(expression)s — saw %(values)s"
            )
            % {
                "name": m["name"],
                "error": m["error"],
                "expression": m["expression"],
                "values": m["values"],
            }
        ),
    ),
    (
        re.compile(r"the run was stopped \((?P<reason>[a-z_]+)\)"),
        lambda m: gettext("the run was stopped (%(reason)s)") % {"reason": label_for(m["reason"])},
    ),
]
_FIXED_NOTES = {"budget enforced at permit": _("budget enforced at permit")}
_UNITS = re.compile(r"(?P<number>[\d.]+) (?P<unit>tool calls|tokens)|(?P<none>no limit)")


def _units(text: str) -> str:
    def word(found: re.Match[str]) -> str:
        if found["none"]:
            return gettext("no limit")
        if found["unit"] == "tokens":
            return gettext("%(number)s tokens") % {"number": found["number"]}
        return gettext("%(number)s tool calls") % {"number": found["number"]}

    return _UNITS.sub(word, text)


def system_note_text(stored: Any) -> str:
    """A stop's or a decision's note in the reader's language when the server wrote it; any
    other note (a person's, an agent's) exactly as it was stored."""
    text = str(stored or "")
    if text in _FIXED_NOTES:
        return str(_FIXED_NOTES[text])
    for pattern, rebuild in _SYSTEM_NOTES:
        found = pattern.fullmatch(text)
        if found is not None:
            return str(rebuild(found))
    return text


# The server's own actors (`Actor.system(...)`): stored in English like every record, named in
# the reader's words. Any other actor — a person, a token, a dispatcher — is shown as stored.
_SYSTEM_ACTORS: dict[str, Any] = {
    "budget": _("budget"),
    "approval-deadline": _("approval deadline"),
    "approval-escalation": _("approval escalation"),
    "drain-watchdog": _("drain watchdog"),
    "lease-reaper": _("lease reaper"),
    "outbox-reaper": _("outbox reaper"),
    "reconciler": _("reconciler"),
    "reprice": _("repricing"),
    "demo-setup": _("demo setup"),
}
_POLICY_ACTOR = re.compile(r"policy:(?P<name>.+)", re.DOTALL)
_SYSTEM_KIND = "system"  # runs.models.ActorKind.SYSTEM (labels stays free of model imports)


def actor_text(name: Any, kind: Any = None) -> str:
    """Who did it, in the reader's words when it was the server (a policy, the budget, a
    reaper). With the actor's kind, only a system actor is translated. Without it (a run's
    `stop_requested_by` keeps the name alone) the server's names are recognised by spelling:
    a person whose username is exactly one of them would read as the server there; the
    ledger, which keeps the kind, tells them apart."""
    text = str(name or "")
    if kind not in (None, "", _SYSTEM_KIND):
        return text
    if text in _SYSTEM_ACTORS:
        return str(_SYSTEM_ACTORS[text])
    found = _POLICY_ACTOR.fullmatch(text)
    if found is not None:
        return gettext("policy %(name)s") % {"name": found["name"]}
    return text
