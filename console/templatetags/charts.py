"""Charts as inline SVG, drawn on the server: no chart library, no script, printable.

Each chart is an <svg role="img"> with an aria-label that says what it shows in words, and a
<title> per bar so a pointer (or a screen reader walking the bars) reads the exact value.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django import template
from django.utils import translation
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext, ngettext

from runs.labels import label_for

register = template.Library()

WIDTH = 560
PAD_LEFT = 34
PAD_BOTTOM = 22
PAD_TOP = 10


def _nice_max(value: int) -> int:
    """The axis top: an even number at or above the largest value, so the middle tick is whole."""
    for step in (
        2,
        4,
        10,
        20,
        40,
        100,
        200,
        400,
        1000,
        2000,
        4000,
        10_000,
        20_000,
        40_000,
        100_000,
    ):
        if value <= step:
            return step
    return value + value % 2


def _frame(height: int, label: str, body: list[str], width: int = WIDTH) -> SafeString:
    return mark_safe(
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
        f'preserveAspectRatio="xMidYMid meet">' + "".join(body) + "</svg>"
    )


def _axis(height: int, top: int, width: int = WIDTH) -> list[str]:
    base = height - PAD_BOTTOM
    mid = (base + PAD_TOP) / 2
    return [
        f'<line class="chart__grid" x1="{PAD_LEFT}" x2="{width}" y1="{PAD_TOP}" y2="{PAD_TOP}"/>',
        f'<line class="chart__grid" x1="{PAD_LEFT}" x2="{width}" y1="{mid}" y2="{mid}"/>',
        f'<line class="chart__axis" x1="{PAD_LEFT}" x2="{width}" y1="{base}" y2="{base}"/>',
        f'<text class="chart__tick" x="{PAD_LEFT - 6}" y="{PAD_TOP + 4}" text-anchor="end">{top}</text>',
        f'<text class="chart__tick" x="{PAD_LEFT - 6}" y="{mid + 4}" text-anchor="end">{top // 2}</text>',
        f'<text class="chart__tick" x="{PAD_LEFT - 6}" y="{base + 4}" text-anchor="end">0</text>',
    ]


def _time_label(moment: datetime, bucket: str) -> str:
    if bucket == "hour":
        return moment.strftime("%H:%M")
    if translation.get_language() == "zh-hans":
        return f"{moment.month}月{moment.day}日"
    return moment.strftime("%b %d")


@register.simple_tag
def stacked_bars(
    series: list[tuple[datetime, int, int]], bucket: str = "day", height: int = 110
) -> SafeString:
    """Stops per bucket: stopped cleanly (bottom) and stopped dirty (top, red).

    This chart spans the page, so its SVG stretches to the width it gets
    (preserveAspectRatio="none"), and its axis labels are HTML beside and under it, at the page's
    own small size: text inside a scaled viewBox grows with the page (22 px at 1280 px)."""
    top = _nice_max(max((clean + dirty for _t, clean, dirty in series), default=0))
    slot = WIDTH / max(len(series), 1)
    bar = max(1.0, slot * 0.7)
    fixed = 'vector-effect="non-scaling-stroke"'
    body = [
        f'<line class="chart__grid" x1="0" x2="{WIDTH}" y1="0.5" y2="0.5" {fixed}/>',
        f'<line class="chart__grid" x1="0" x2="{WIDTH}" y1="{height / 2}" y2="{height / 2}" {fixed}/>',
        f'<line class="chart__axis" x1="0" x2="{WIDTH}" y1="{height - 0.5}" y2="{height - 0.5}" {fixed}/>',
    ]
    for index, (moment, clean, dirty) in enumerate(series):
        x = index * slot + (slot - bar) / 2
        clean_h = height * clean / top
        dirty_h = height * dirty / top
        title = gettext("%(when)s: %(clean)s stopped cleanly, %(dirty)s stopped dirty") % {
            "when": _time_label(moment, bucket),
            "clean": clean,
            "dirty": dirty,
        }
        body.append(f"<g><title>{escape(title)}</title>")
        if clean:
            body.append(
                f'<rect class="chart__bar chart__bar--clean" x="{x:.1f}" y="{height - clean_h:.1f}" '
                f'width="{bar:.1f}" height="{clean_h:.1f}"/>'
            )
        if dirty:
            body.append(
                f'<rect class="chart__bar chart__bar--dirty" x="{x:.1f}" '
                f'y="{height - clean_h - dirty_h:.1f}" width="{bar:.1f}" height="{dirty_h:.1f}"/>'
            )
        body.append("</g>")
    total_clean = sum(clean for _t, clean, _d in series)
    total_dirty = sum(dirty for _t, _c, dirty in series)
    label = gettext(
        "Stops per %(bucket)s: %(clean)s stopped cleanly and %(dirty)s stopped dirty in the period"
    ) % {"bucket": label_for(bucket), "clean": total_clean, "dirty": total_dirty}
    picks = sorted({0, len(series) // 2, len(series) - 1}) if series else []
    x_labels = "".join(
        f"<span>{escape(_time_label(series[index][0], bucket))}</span>" for index in picks
    )
    return mark_safe(
        '<div class="chart-frame">'
        f'<div class="chart-axis chart-axis--y" aria-hidden="true"><span>{top}</span>'
        f"<span>{top // 2}</span><span>0</span></div>"
        f'<svg class="chart chart--stretch" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{escape(label)}" preserveAspectRatio="none">' + "".join(body) + "</svg>"
        f'<div class="chart-axis chart-axis--x" aria-hidden="true">{x_labels}</div>'
        "</div>"
    )


def _x_labels(
    series: list[Any], bucket: str, slot: float, height: int, width: int = WIDTH
) -> list[str]:
    if not series:
        return []
    picks = sorted({0, len(series) // 2, len(series) - 1})
    out = []
    for index in picks:
        x = PAD_LEFT + index * slot + slot / 2
        anchor = "start" if index == 0 else ("end" if index == len(series) - 1 else "middle")
        if index == 0:
            x = PAD_LEFT
        elif index == len(series) - 1:
            x = width
        out.append(
            f'<text class="chart__tick" x="{x:.1f}" y="{height - 6}" text-anchor="{anchor}">'
            f"{escape(_time_label(series[index][0], bucket))}</text>"
        )
    return out


@register.simple_tag
def bars(
    series: list[tuple[datetime, int]],
    bucket: str = "day",
    height: int = 120,
    what: str = "count",
    tone: str = "warn",
    width: int = 320,
) -> SafeString:
    """A single series over time; drawn narrower, for the small figure cards."""
    top = _nice_max(max((value for _t, value in series), default=0))
    base = height - PAD_BOTTOM
    span = base - PAD_TOP
    body = _axis(height, top, width)
    slot = (width - PAD_LEFT) / max(len(series), 1)
    bar = max(1.0, slot * 0.7)
    for index, (moment, value) in enumerate(series):
        if not value:
            continue
        x = PAD_LEFT + index * slot + (slot - bar) / 2
        h = span * value / top
        body.append(
            f"<g><title>{escape(f'{_time_label(moment, bucket)}: {value} {what}')}</title>"  # noqa: E501
            f'<rect class="chart__bar chart__bar--{tone}" x="{x:.1f}" y="{base - h:.1f}" '
            f'width="{bar:.1f}" height="{h:.1f}"/></g>'
        )
    body.extend(_x_labels(series, bucket, slot, height, width))
    total = sum(value for _t, value in series)
    label = gettext("%(what)s per %(bucket)s: %(total)s in the period") % {
        "what": what,
        "bucket": label_for(bucket),
        "total": total,
    }
    return _frame(height, label, body, width)


@register.simple_tag
def histogram(buckets: list[tuple[str, int]], height: int = 150) -> SafeString:
    """Cancel → safe stop latency: how many stops settled within each bound."""
    top = _nice_max(max((value for _l, value in buckets), default=0))
    base = height - PAD_BOTTOM
    span = base - PAD_TOP
    body = _axis(height, top)
    slot = (WIDTH - PAD_LEFT) / max(len(buckets), 1)
    bar = slot * 0.78
    for index, (label, value) in enumerate(buckets):
        x = PAD_LEFT + index * slot + (slot - bar) / 2
        h = span * value / top
        slow = index >= len(buckets) - 3  # the last buckets are seconds: worth a different tone
        tone = "warn" if slow else "info"
        body.append(
            f"<g><title>{escape(stops_text(label, value))}</title>"
            f'<rect class="chart__bar chart__bar--{tone}" x="{x:.1f}" y="{base - h:.1f}" '
            f'width="{bar:.1f}" height="{max(h, 0):.1f}"/>'
        )
        if value:
            body.append(
                f'<text class="chart__value" x="{x + bar / 2:.1f}" y="{base - h - 3:.1f}" '
                f'text-anchor="middle">{value}</text>'
            )
        body.append(
            f'<text class="chart__tick" x="{x + bar / 2:.1f}" y="{height - 6}" '
            f'text-anchor="middle">{escape(label)}</text></g>'
        )
    summary = ", ".join(f"{label}: {value}" for label, value in buckets if value) or gettext(
        "no stops"
    )
    return _frame(
        height,
        gettext("Latency from stop request to stopped: %(summary)s") % {"summary": summary},
        body,
    )


def stops_text(label: str, value: int) -> str:
    return ngettext("%(label)s: %(n)s stop", "%(label)s: %(n)s stops", value) % {
        "label": label,
        "n": value,
    }


@register.simple_tag
def meter(rate: float | None, good_above: float = 0.9, labelledby: str = "") -> SafeString:
    """A horizontal bar for a share (0..1); None draws an empty, labelled track. `labelledby`:
    the id of the figure's title, which names the meter for assistive technology."""
    if rate is None:
        return format_html(
            '<div class="meter meter--empty" role="img" aria-label="{}">'
            '<span class="meter__label">{}</span></div>',
            gettext("no data"),
            gettext("no data in this period"),
        )
    tone = "ok" if rate >= good_above else ("warn" if rate >= good_above / 2 else "bad")
    return format_html(
        '<div class="meter meter--{}" role="meter" aria-valuemin="0" aria-valuemax="100" '
        'aria-valuenow="{}" aria-valuetext="{}%"{}>'
        # An SVG rect, not a style attribute: the CSP (style-src 'self') refuses inline styles.
        '<svg class="meter__bar" viewBox="0 0 100 12" preserveAspectRatio="none" aria-hidden="true">'
        '<rect class="meter__fill" x="0" y="0" height="12" width="{}"></rect></svg></div>',
        tone,
        round(rate * 100),
        round(rate * 100),
        format_html(' aria-labelledby="{}"', labelledby) if labelledby else "",
        f"{rate * 100:.1f}",
    )
