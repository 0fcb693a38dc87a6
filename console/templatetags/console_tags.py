"""Status chips, state tags and small formatting filters for the console templates."""

from __future__ import annotations

import json
import math
from datetime import datetime
from decimal import Decimal
from typing import Any

from django import template
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.html import format_html

register = template.Library()

# Every run state has its own colour and glyph; the label is always written out too, so colour
# is never the only signal (colour-blind readers, printouts).
RUN_STATES: dict[str, tuple[str, str]] = {
    "pending": ("○", "Pending"),
    "running": ("●", "Running"),
    "suspended": ("‖", "Suspended"),
    "interrupted": ("◆", "Interrupted"),
    "cancel_requested": ("◔", "Cancel requested"),
    "draining": ("◑", "Draining"),
    "stopped_cleanly": ("■", "Stopped cleanly"),
    "stopped_dirty": ("▲", "Stopped dirty"),
    "handed_off": ("➜", "Handed off"),
    "completed": ("✓", "Completed"),
    "failed": ("✕", "Failed"),
    "cancelled": ("⊘", "Cancelled"),
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
    text = (value or "live").replace("_", " ")
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
    return str(value or "").replace("_", " ")


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
    return f"{ms / 60_000:.1f} min"


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
        moment.strftime("%Y-%m-%d %H:%M:%S UTC"),
        _age_text(seconds),
    )


def _age_text(seconds: float) -> str:
    if seconds < 1:
        return "just now"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min ago"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h ago"
    return f"{seconds // 86400:.0f} d ago"


def _left_text(seconds: float) -> str:
    """'in 24 s', 'in 14 min 29 s', 'in 2 h 5 min' (as console.js's leftText)."""
    whole = math.ceil(seconds)
    if whole < 60:
        return f"in {whole} s"
    if whole < 3600:
        return f"in {whole // 60} min {whole % 60} s"
    return f"in {whole // 3600} h {whole % 3600 // 60} min"


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
    text = _left_text(left) if left > 0 else f"passed, {_age_text(-left)}"
    return format_html(
        '<time class="{}" datetime="{}" data-countdown data-offset="{}" title="{}">{}</time>',
        "" if left > 0 else "is-late",
        moment.isoformat(),
        float(offset_seconds or 0),
        end.strftime("%Y-%m-%d %H:%M:%S UTC"),
        text,
    )


@register.simple_tag
def stamp(value: Any) -> str:
    """An absolute UTC time, precise to the millisecond, for the record."""
    moment = _as_datetime(value)
    if moment is None:
        return "—"
    return format_html(
        '<time datetime="{}">{}</time>',
        moment.isoformat(),
        moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC",
    )


@register.filter
def get_item(mapping: Any, key: Any) -> Any:
    try:
        return mapping.get(key)
    except AttributeError:
        return None
