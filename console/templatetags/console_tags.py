"""Status chips, state tags and small formatting filters for the console templates."""

from __future__ import annotations

import json
import math
from datetime import datetime
from decimal import Decimal
from typing import Any

from django import template
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext, pgettext_lazy

from runs.labels import actor_text, approval_reason_text, label_for, system_note_text

register = template.Library()

# Every run state has its own colour and glyph; the label is always written out too, so colour
# is never the only signal (colour-blind readers, printouts).
RUN_STATES: dict[str, tuple[str, Any]] = {
    "pending": ("○", pgettext_lazy("run state", "Pending")),
    "running": ("●", pgettext_lazy("run state", "Running")),
    "suspended": ("‖", pgettext_lazy("run state", "Suspended")),
    "interrupted": ("◆", pgettext_lazy("run state", "Interrupted")),
    "cancel_requested": ("◔", pgettext_lazy("run state", "Cancel requested")),
    "draining": ("◑", pgettext_lazy("run state", "Draining")),
    "stopped_cleanly": ("■", pgettext_lazy("run state", "Stopped cleanly")),
    "stopped_dirty": ("▲", pgettext_lazy("run state", "Stopped dirty")),
    "handed_off": ("➜", pgettext_lazy("run state", "Handed off")),
    "completed": ("✓", pgettext_lazy("run state", "Completed")),
    "failed": ("✕", pgettext_lazy("run state", "Failed")),
    "cancelled": ("⊘", pgettext_lazy("run state", "Cancelled")),
}

# Tones for the states of the run's children (see .tag--* in console.css).
TONES: dict[str, dict[str, str]] = {
    "execution": {
        "permitted": "info",
        "running": "info",
        "succeeded": "ok",
        "failed": "bad",
        "not_started": "muted",
        "unknown": "alert",
    },
    "side_effect": {
        "none": "muted",
        "pending_verification": "alert",
        "applied": "ink",
        "not_applied": "muted",
        "compensated": "purple",
    },
    "remote_cancel": {
        "not_requested": "muted",
        "requested": "warn",
        "confirmed": "ok",
        "refused": "bad",
    },
    "outbox": {
        "pending": "info",
        "dispatching": "warn",
        "sent": "ok",
        "failed": "bad",
        "frozen": "frost",
        "unknown": "alert",
        "released": "info",
        "discarded": "muted",
    },
    "step": {
        "planned": "muted",
        "running": "info",
        "completed": "ok",
        "failed": "bad",
        "cancelled": "muted",
        "unknown": "alert",
    },
    "steering": {
        "queued": "info",
        "applied": "ok",
        "unapplied_at_stop": "warn",
        "carried_over": "purple",
        "discarded": "muted",
    },
    "handoff": {
        "open": "warn",
        "accepted": "info",
        "completed": "ok",
        "returned": "purple",
        "closed": "muted",
    },
    "lease": {"": "info", "released": "ok", "revoked_by_stop": "warn", "expired": "bad"},
    "decision": {"applied": "ink", "not_applied": "muted", "compensated": "purple"},
    "actor": {"user": "info", "api_client": "purple", "system": "muted"},
}


@register.simple_tag(takes_context=True)
def current_access(context: template.Context) -> Any:
    """For pages rendered without the console's context (login, error pages): the user's Access."""
    from console.access import request_access

    request = context.get("request")
    return request_access(request) if request is not None else None


@register.simple_tag
def status_chip(status: str, size: str = "") -> str:
    _glyph, label = RUN_STATES.get(status, ("?", status))
    # The glyph is drawn by CSS (.chip--<status> .chip__glyph::before), so the chip's text is
    # exactly its label for screen readers, copy-paste and tests.
    return format_html(
        '<span class="chip chip--{}{}" data-status="{}"><span class="chip__glyph" aria-hidden="true"></span>{}</span>',
        status,
        f" chip--{size}" if size else "",
        status,
        label,
    )


@register.simple_tag
def state_tag(value: str, kind: str) -> str:
    tone = TONES.get(kind, {}).get(value or "", "muted")
    text = label_for(value or "live")
    return format_html('<span class="tag tag--{}">{}</span>', tone, text)


@register.filter
def usd(value: Any) -> str:
    """A cost in US dollars: cents from $1 up, else up to six decimals ($0.0035), never
    rounded to $0 when it is not 0."""
    if value is None or value == "":
        return "—"
    amount = Decimal(str(value))
    if amount == 0:
        return "$0.00"
    if abs(amount) >= 1:
        return f"${amount:,.2f}"
    if abs(amount) < Decimal("0.000001"):
        return "<$0.000001"
    whole, _, fraction = f"{amount:.6f}".partition(".")
    return f"${whole}.{fraction.rstrip('0').ljust(2, '0')}"


@register.filter
def human(value: Any) -> str:
    """A code (`stopped_dirty`, `lease_expired`) as words in the reader's language."""
    return label_for(value)


@register.filter
def approval_why(value: Any) -> str:
    """Why an approval waits (the rule match it stored, in English) in the reader's words."""
    return approval_reason_text(value)


@register.filter
def system_note(value: Any) -> str:
    """A note the server wrote on a stop (a budget's, a policy's) in the reader's words; a
    person's note as typed."""
    return system_note_text(value)


@register.filter
def actor(value: Any, kind: Any = None) -> str:
    """Who did it: the server's own actors (a policy, the budget) in the reader's words, a
    person or a token as stored."""
    return actor_text(value, kind)


@register.filter
def errors_line(form: Any, leave_out: str = "") -> str:
    """A form's errors as one line, each after its field's translated label; `leave_out` is a
    comma-separated list of fields whose errors the page shows beside the field."""
    from console.views.common import form_errors  # the views import these tags' module

    return form_errors(form, leave_out=[name for name in leave_out.split(",") if name])


@register.filter
def role_label(value: Any) -> str:
    return label_for(value)


@register.filter
def short_hash(value: str, length: int = 10) -> str:
    return (value or "")[:length]


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)


@register.simple_tag
def payload(value: Any, limit: int = 140) -> str:
    """A ledger or audit payload in one line; a longer one is cut there and opens in place
    (a <details>) to the whole of it, laid out."""
    text = json.dumps(
        value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False, cls=DjangoJSONEncoder
    )
    if len(text) <= limit:
        return format_html('<span class="mono">{}</span>', text)
    return format_html(
        '<details class="payload-more"><summary class="mono">{}</summary>'
        '<pre class="json">{}</pre></details>',
        text[: limit - 1] + "…",
        pretty_json(value),
    )


@register.filter
def compact_json(value: Any, limit: int = 160) -> str:
    text = json.dumps(
        value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False, cls=DjangoJSONEncoder
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _as_datetime(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        from django.utils.dateparse import parse_datetime

        return parse_datetime(value)
    return None


@register.filter
def ms_between(start: Any, end: Any) -> str:
    """'+180 ms' between two instants (datetimes or ISO strings), for the stop progression."""
    a, b = _as_datetime(start), _as_datetime(end)
    if a is None or b is None:
        return ""
    ms = (b - a).total_seconds() * 1000
    return format_ms(ms)


@register.filter
def format_ms(value: Any) -> str:
    if value is None or value == "":
        return "—"
    ms = float(value)
    if ms < 0.5:
        return "0 ms"
    if ms < 1:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return gettext("%(n)s min") % {"n": f"{ms / 60_000:.1f}"}


@register.filter
def pct(value: Any) -> str:
    if value is None:
        return "—"
    return f"{float(value) * 100:.0f}%"


@register.filter
def iso(value: Any) -> str:
    moment = _as_datetime(value)
    return moment.isoformat() if moment else ""


@register.filter
def parse_iso(value: Any) -> datetime | None:
    return _as_datetime(value)


@register.simple_tag
def ago(value: Any, css: str = "") -> str:
    """A <time> the page's script keeps current ('12 s ago'); the server writes the first text."""
    moment = _as_datetime(value)
    if moment is None:
        return "—"
    from django.utils import timezone

    seconds = max(0, (timezone.now() - moment).total_seconds())
    return format_html(
        '<time class="{}" datetime="{}" data-ago title="{}">{}</time>',
        css,
        moment.isoformat(),
        _local(moment),
        _age_text(seconds),
    )


def _local(moment: datetime, *, milliseconds: bool = False) -> str:
    """`moment` in the reader's time zone (their team's; the middleware activates it), named."""
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    text = local.strftime("%Y-%m-%d %H:%M:%S")
    if milliseconds:
        text += f".{local.microsecond // 1000:03d}"
    return f"{text} {_zone_name(local)}"


def _zone_name(local: datetime) -> str:
    """`UTC`, or the offset from it (`UTC+08:00`): a letter abbreviation (CST) means different
    zones to different readers and is not translated."""
    offset = local.utcoffset()
    if not offset:
        return "UTC"
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _age_text(seconds: float) -> str:
    """'12 s ago' in the reader's language (as console.js's ageText, through its catalog)."""
    if seconds < 1:
        return gettext("just now")
    if seconds < 60:
        return gettext("%(n)s s ago") % {"n": f"{seconds:.0f}"}
    if seconds < 3600:
        return gettext("%(n)s min ago") % {"n": f"{seconds // 60:.0f}"}
    if seconds < 86400:
        return gettext("%(n)s h ago") % {"n": f"{seconds // 3600:.0f}"}
    return gettext("%(n)s d ago") % {"n": f"{seconds // 86400:.0f}"}


def _left_text(seconds: float) -> str:
    """'in 24 s', 'in 14 min 29 s', 'in 2 h 5 min' (as console.js's leftText): '还剩 24 秒' …"""
    whole = math.ceil(seconds)
    if whole < 60:
        return gettext("in %(s)s s") % {"s": whole}
    if whole < 3600:
        return gettext("in %(min)s min %(s)s s") % {"min": whole // 60, "s": whole % 60}
    return gettext("in %(h)s h %(min)s min") % {"h": whole // 3600, "min": whole % 3600 // 60}


@register.simple_tag
def countdown(value: Any, offset_seconds: Any = 0) -> str:
    """'in 24 s' until `value` + offset; the page's script keeps it counting down."""
    moment = _as_datetime(value)
    if moment is None:
        return "—"
    from datetime import timedelta

    from django.utils import timezone

    end = moment + timedelta(seconds=float(offset_seconds or 0))
    left = (end - timezone.now()).total_seconds()
    text = _left_text(left) if left > 0 else gettext("passed, %(ago)s") % {"ago": _age_text(-left)}
    return format_html(
        '<time class="{}" datetime="{}" data-countdown data-offset="{}" title="{}">{}</time>',
        "" if left > 0 else "is-late",
        moment.isoformat(),
        float(offset_seconds or 0),
        _local(end),
        text,
    )


@register.simple_tag
def stamp(value: Any) -> str:
    """An absolute time in the reader's team's time zone, precise to the millisecond."""
    moment = _as_datetime(value)
    if moment is None:
        return "—"
    return format_html(
        '<time datetime="{}">{}</time>', moment.isoformat(), _local(moment, milliseconds=True)
    )


@register.filter
def recovery_text(record: Any) -> str:
    """What to do about an unknown write, in the reader's language (the packet's snapshot keeps
    its English `recovery_action`; this says the same from the record's own fields)."""
    if not isinstance(record, dict):
        return ""
    stored = str(record.get("recovery_action") or "")
    target = record.get("operation_id") or record.get("tool_call_id") or ""
    tool = record.get("tool") or ""
    policy = record.get("recovery_policy")
    if not stored:
        return gettext("confirm manually")
    if policy == "query_original":
        return gettext("query %(target)s; do not re-run %(tool)s") % {
            "target": target,
            "tool": tool,
        }
    if policy == "reuse_idempotency_key" and record.get("idempotency_key"):
        return gettext("retry only with idempotency key %(key)s") % {
            "key": record["idempotency_key"]
        }
    if policy == "compensate":
        return gettext("verify %(target)s, then compensate if it was applied") % {"target": target}
    return gettext("confirm manually whether %(tool)s (%(target)s) took effect") % {
        "tool": tool,
        "target": target,
    }


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None
