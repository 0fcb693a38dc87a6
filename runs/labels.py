"""Codes as words: the console shows a state or a reason (`stopped_dirty`, `lease_expired`) in
the reader's language; the code itself stays English everywhere else (API, ledger, exports).

A code missing here is shown as itself with spaces for underscores, so a new code is never
hidden, only untranslated until it is added (the zh-Hans page test finds it).
"""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

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
