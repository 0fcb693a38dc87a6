"""`GET /metrics`: the stop-quality figures (DESIGN §7), the approval figures (DESIGN §10) and
queue depths, as Prometheus text.

Who may scrape it:
- a staff session (every team), or
- `Authorization: Bearer <token>` with a **reviewer** token (its own team only — the same
  scoping `GET /api/v1/metrics/stop-quality/` applies to a token).
Anything else is refused: no or a bad credential 401, a valid one without the right 403.
Agent tokens are refused because a scraper credential lives in monitoring config, and an agent
token there would also be able to lease runs and ask permits.

The figures are computed by `handoff.selectors.stop_quality` over a trailing window
(`?window=<seconds>`, default 24 h, 1 min … 30 days), so this endpoint and the API answer
with the same numbers for the same period. Values with no samples are `NaN`, as Prometheus
expects, never 0: "no stop measured" is not "stops take 0 ms".
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.http import require_GET

from api.ratelimit import (
    bearer_failure_record,
    bearer_guessing_wait,
    client_address,
    denial_counts,
)
from console.selectors.metrics import login_failures, team_slugs
from handoff.selectors import stop_quality
from runs.models import TokenRole
from runs.selectors import queue_depths, usage_totals
from runs.tokens import api_token_authenticate

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_WINDOW = timedelta(hours=24)
MIN_WINDOW_SECONDS = 60
MAX_WINDOW_SECONDS = 30 * 24 * 3600


class _Refusal(Exception):
    def __init__(self, status: int, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


def _guessing(wait: float) -> _Refusal:
    return _Refusal(429, "too many wrong bearer tokens from this address", retry_after=wait)


def _scope(request: HttpRequest) -> list[int] | None:
    """The teams the caller may scrape: None for every team (staff), else one token's team."""
    header = request.headers.get("Authorization", "")
    if header:
        # The same guessing limit per address as the API (api.ratelimit).
        address = client_address(request)
        wait = bearer_guessing_wait(client_ip=address)
        if wait is not None:
            raise _guessing(wait)
        parts = header.split()
        token = (
            api_token_authenticate(parts[1])
            if len(parts) == 2 and parts[0].lower() == "bearer"
            else None
        )
        if token is None:
            wait = bearer_failure_record(client_ip=address)
            if wait is not None:
                raise _guessing(wait)
            if len(parts) != 2 or parts[0].lower() != "bearer":
                raise _Refusal(401, "Authorization must be 'Bearer <token>'")
            raise _Refusal(401, "unknown or revoked token")
        if token.role != TokenRole.REVIEWER:
            raise _Refusal(403, "/metrics needs a reviewer token or a staff session")
        return [token.team_id]
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        raise _Refusal(401, "log in as staff or send a reviewer bearer token")
    if not (user.is_staff or user.is_superuser):
        raise _Refusal(403, "/metrics needs a reviewer token or a staff session")
    return None


def _window(request: HttpRequest) -> timedelta:
    raw = request.GET.get("window")
    if raw is None:
        return DEFAULT_WINDOW
    try:
        seconds = int(raw)
    except ValueError:
        raise _Refusal(400, "window is a whole number of seconds") from None
    if not MIN_WINDOW_SECONDS <= seconds <= MAX_WINDOW_SECONDS:
        raise _Refusal(
            400, f"window must be between {MIN_WINDOW_SECONDS} and {MAX_WINDOW_SECONDS} seconds"
        )
    return timedelta(seconds=seconds)


def _number(value: float | int | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "NaN"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels.items()) + "}"


class _Exposition:
    """Prometheus text format 0.0.4: HELP and TYPE once per family, then its samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], Any]]
    ) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _ms_to_seconds(value: float | None) -> float | None:
    return None if value is None else value / 1000.0


def render_metrics(
    figures: dict[str, Any],
    depths: dict[str, int],
    window: timedelta,
    *,
    denials: dict[str, int] | None = None,
    logins: dict[str, int] | None = None,
    usage: list[dict[str, Any]] | None = None,
) -> str:
    out = _Exposition()
    out.family(
        "safestop_metrics_window_seconds",
        "gauge",
        "Length of the trailing window the stop-quality figures cover.",
        [({}, int(window.total_seconds()))],
    )
    out.family(
        "safestop_stops",
        "gauge",
        "Stops requested in the window, by outcome so far.",
        [
            ({"outcome": "all"}, figures["stops"]),
            ({"outcome": "stopped_cleanly"}, figures["stopped_cleanly"]),
            ({"outcome": "stopped_dirty"}, figures["stopped_dirty"]),
        ],
    )
    # 1. cancel → safe stop latency (and → the worker receiving the signal)
    latency_samples: list[tuple[dict[str, str], Any]] = []
    count_samples: list[tuple[dict[str, str], Any]] = []
    for figure, label in (("to_stopped", "stopped"), ("to_worker_signal", "worker_signal")):
        summary = figures["stop_latency"][figure]
        for quantile, key in (("0.5", "p50_ms"), ("0.95", "p95_ms"), ("0.99", "p99_ms")):
            latency_samples.append(
                ({"to": label, "quantile": quantile}, _ms_to_seconds(summary[key]))
            )
        count_samples.append(({"to": label}, summary["count"]))
    out.family(
        "safestop_stop_latency_seconds",
        "gauge",
        "From stop request to stopped_* (to=stopped) or to the worker's socket (to=worker_signal).",
        latency_samples,
    )
    out.family(
        "safestop_stop_latency_samples", "gauge", "Stops measured for each latency.", count_samples
    )
    # 2. side-effect leakage (must be 0)
    leakage = figures["side_effect_leakage"]
    out.family(
        "safestop_side_effect_leakage",
        "gauge",
        "Tool permits or outbox dispatches that started after a stop of their epoch (must be 0).",
        [
            ({"kind": "permit"}, leakage["permits_after_stop"]),
            ({"kind": "dispatch"}, leakage["dispatches_after_stop"]),
        ],
    )
    # 3. late writes after stop
    out.family(
        "safestop_late_writes_rejected",
        "gauge",
        "Stale-epoch writes refused in the window.",
        [({}, figures["late_writes_rejected"])],
    )
    # 4. interruptions recovered cleanly
    interruptions = figures["interruptions_recovered_cleanly"]
    out.family(
        "safestop_interruptions",
        "gauge",
        "Runs interrupted in the window, and how many recovered cleanly.",
        [
            ({"state": "interrupted"}, interruptions["interrupted"]),
            ({"state": "recovered_cleanly"}, interruptions["recovered_cleanly"]),
        ],
    )
    out.family(
        "safestop_interruptions_recovered_ratio",
        "gauge",
        "Share of interrupted runs that stopped cleanly or resumed without unknowns.",
        [({}, interruptions["rate"])],
    )
    # 5. handoff completion rate
    handoffs = figures["handoff_completion"]
    out.family(
        "safestop_handoffs",
        "gauge",
        "Handoffs created in the window, and how many finished.",
        [
            ({"state": "created"}, handoffs["handoffs"]),
            ({"state": "finished"}, handoffs["finished"]),
        ],
    )
    out.family(
        "safestop_handoff_completion_ratio",
        "gauge",
        "Share of handoffs that reached completed, returned or closed.",
        [({}, handoffs["rate"])],
    )
    # approvals (DESIGN §10): time to a reviewer's decision, and how approvals ended
    approvals = figures["approvals"]
    decision = approvals["time_to_decision"]
    out.family(
        "safestop_approval_time_to_decision_seconds",
        "gauge",
        "From an approval's request to a reviewer approving or rejecting it.",
        [
            ({"quantile": quantile}, _ms_to_seconds(decision[key]))
            for quantile, key in (("0.5", "p50_ms"), ("0.95", "p95_ms"), ("0.99", "p99_ms"))
        ],
    )
    out.family(
        "safestop_approval_time_to_decision_samples",
        "gauge",
        "Approvals decided by a reviewer, measured for the time to decision.",
        [({}, decision["count"])],
    )
    out.family(
        "safestop_approvals",
        "gauge",
        "Approvals requested in the window, by status now "
        "(approved_with_edits is part of approved).",
        [({"status": "all"}, approvals["requested"])]
        + [
            ({"status": status}, approvals[status])
            for status in (
                "waiting",
                "approved",
                "approved_with_edits",
                "rejected",
                "expired",
                "void",
            )
        ],
    )
    # queues
    out.family(
        "safestop_queue_depth",
        "gauge",
        "Work waiting now, by queue.",
        [({"queue": name}, value) for name, value in sorted(depths.items())],
    )
    # cost (DESIGN §13): counters since the first usage event, not windowed
    if usage is not None:
        _cost_families(out, usage)
    # guessing: refused API credentials and console sign-ins
    if denials is not None:
        out.family(
            "safestop_api_denials",
            "gauge",
            "API requests refused in the window: unknown or revoked token (bad_token), another "
            "team's run, a role that may not, an address throttled for guessing tokens.",
            [
                ({"reason": reason}, denials.get(reason, 0))
                for reason in ("bad_token", "wrong_team", "wrong_role", "throttled")
            ],
        )
    if logins is not None:
        out.family(
            "safestop_login_failures",
            "gauge",
            "Failed console sign-ins in the window, and those refused by a lockout.",
            [
                ({"outcome": "failed"}, logins["failed"]),
                ({"outcome": "locked_out"}, logins["locked_out"]),
            ],
        )
    return out.text()


def _cost_families(out: _Exposition, usage: list[dict[str, Any]]) -> None:
    out.family(
        "safestop_cost_usd_total",
        "counter",
        "USD spent by priced model calls, by team, agent and model (unpriced calls are not in "
        "it: see safestop_unpriced_tokens_total).",
        [
            ({"team": row["team"], "agent": row["agent"], "model": row["model_name"]}, row["cost"])
            for row in usage
            if row["cost"] is not None
        ],
    )
    out.family(
        "safestop_unpriced_tokens_total",
        "counter",
        "Tokens of model calls no price was found for (their cost is unknown, not 0).",
        [
            (
                {"team": row["team"], "agent": row["agent"], "model": row["model_name"]},
                row["unpriced"],
            )
            for row in usage
            if row["unpriced"]
        ],
    )
    by_team: dict[str, dict[str, int]] = {}
    for row in usage:
        counts = by_team.setdefault(row["team"], dict.fromkeys(_TOKEN_TYPES, 0))
        for kind in _TOKEN_TYPES:
            counts[kind] += row[kind]
    out.family(
        "safestop_tokens_total",
        "counter",
        "Model tokens reported, by team and type (input counts the cached ones too).",
        [
            ({"team": team, "type": kind}, counts[kind])
            for team, counts in sorted(by_team.items())
            for kind in _TOKEN_TYPES
        ],
    )


_TOKEN_TYPES = ("input", "output", "cache_read", "cache_write")


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        team_ids = _scope(request)
        window = _window(request)
    except _Refusal as refusal:
        response = HttpResponse(
            refusal.detail + "\n", status=refusal.status, content_type="text/plain; charset=utf-8"
        )
        if refusal.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="safestop"'
        if refusal.retry_after is not None:
            response["Retry-After"] = str(max(1, math.ceil(refusal.retry_after)))
        return response
    until = timezone.now()
    figures = stop_quality(since=until - window, until=until, team_ids=team_ids)
    depths = queue_depths(team_ids=team_ids)
    # Sign-ins name no team, so only staff (team_ids None) see them; a token sees its team's
    # denials, staff every denial.
    slugs = None if team_ids is None else team_slugs(team_ids=team_ids)
    denials = denial_counts(since=until - window, team_slugs=slugs)
    logins = login_failures(since=until - window) if team_ids is None else None
    text = render_metrics(
        figures,
        depths,
        window,
        denials=denials,
        logins=logins,
        usage=usage_totals(team_ids=team_ids),
    )
    response = HttpResponse(text, content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response


# Included at `/metrics` by `console.urls` (one line there; the route lives with its view).
urlpatterns = [path("", metrics, name="metrics")]
