"""Abuse limits: a per-caller rate limit, and counted denials.

Rate limit, a fixed one-minute window per caller (`token:<id>` or `user:<id>`):
- with `settings.REDIS_URL`: `INCR` + `EXPIRE ... NX` on one key per window, in one Lua
  script (`EVALSHA`: one command, where MULTI/INCR/EXPIRE/EXEC were four to pack, send and
  parse on every request). A script runs atomically in Redis and INCR is atomic anyway, so N
  concurrent requests see N distinct counts and exactly `limit` of them pass, across every
  daphne process sharing the Redis;
- without Redis: one statement, `INSERT ... ON CONFLICT (bucket, window) DO UPDATE SET
  hits = hits + 1 RETURNING hits`. PostgreSQL takes the row lock for the conflicting update and
  SQLite holds its single write lock for the statement, so the increment and the read of the
  new count are one atomic step on both. (Django's cache `incr()` is a get-then-set on the
  database cache backend and would let concurrent requests overwrite each other's increments.)

If Redis is configured but unreachable the database counter takes over: a limit that still
holds is better than refusing every agent, and better than none.

Not limited: the stop path (`STOP_PATH`). A reviewer must always be able to stop, and a worker
over its limit must still be able to heartbeat (which carries the stop signal) and drain (its
facts can ride in the `drained` body); each is one short transaction on one run.

Guessing tokens, per client address: `SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE` wrong bearer tokens
from one address in a window, then every bearer request from it answers 429 with `Retry-After`
until the window ends (the right token too, or a 200 would tell the guesser which one it was).
A wrong token on the agent websocket counts against the same budget, and a blocked address's
handshakes are closed with 4429 (`api.consumers`).
The failures are counted with the same shared counter; the block itself is remembered per
process, so with N web processes a guesser gets at most N more tries per window.

Denials (bad token, another team's run, a role that may not do this, a throttled guesser) are
counted per minute in `runs_api.Denial` with the same kind of atomic upsert and listed for
admins by `GET /api/v1/security/denials/`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from api.models import Denial, RateWindow

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 60
# Windows older than this are deleted by the bucket's own first hit of a new window, so each
# caller keeps a handful of rows and the table never needs a separate sweeper.
_KEEP_WINDOWS = 5


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    hits: int
    limit: int
    retry_after: float


def rate_limit_hit(*, bucket: str, limit: int, now: float | None = None) -> RateDecision:
    """Count one request of `bucket` in the current window; say whether it may proceed."""
    now = time.time() if now is None else now
    window = int(now // WINDOW_SECONDS)
    hits = _redis_hit(bucket, window) if settings.REDIS_URL else None
    if hits is None:
        hits = _db_hit(bucket, window)
    retry_after = (window + 1) * WINDOW_SECONDS - now
    return RateDecision(allowed=hits <= limit, hits=hits, limit=limit, retry_after=retry_after)


@lru_cache(maxsize=4)
def _redis_client(url: str) -> Any:
    import redis

    # Short timeouts: a slow Redis must not hold up an agent's stop or permit.
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


# KEYS[1]: the window's key; ARGV[1]: its lifetime in seconds. `NX`: the first hit of a window
# sets the lifetime, the others leave it running.
_HIT_SCRIPT = """
local hits = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1], 'NX')
return hits
"""


@lru_cache(maxsize=4)
def _hit_script(url: str) -> Any:
    # `register_script` sends EVALSHA, and loads the script again if Redis lost it (a restart).
    return _redis_client(url).register_script(_HIT_SCRIPT)


def _redis_hit(bucket: str, window: int) -> int | None:
    key = f"safestop:rl:{bucket}:{window}"
    try:
        return int(_hit_script(settings.REDIS_URL)(keys=[key], args=[WINDOW_SECONDS * 2]))
    except Exception:  # Redis down or misconfigured: fall back to the database counter
        logger.warning("rate limit: Redis unavailable, counting in the database", exc_info=True)
        return None


def _db_hit(bucket: str, window: int) -> int:
    quote = connection.ops.quote_name
    table = quote(RateWindow._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({quote('bucket')}, {quote('window_start')}, {quote('hits')}) "
            f"VALUES (%s, %s, 1) "
            f"ON CONFLICT ({quote('bucket')}, {quote('window_start')}) "
            f"DO UPDATE SET {quote('hits')} = {table}.{quote('hits')} + 1 "
            f"RETURNING {quote('hits')}",
            [bucket, window],
        )
        hits = int(cursor.fetchone()[0])
        if hits == 1:
            cursor.execute(
                f"DELETE FROM {table} WHERE {quote('bucket')} = %s AND {quote('window_start')} < %s",
                [bucket, window - _KEEP_WINDOWS],
            )
    return hits


def client_address(request: Any) -> str:
    # REMOTE_ADDR only: X-Forwarded-For is attacker-controlled unless a trusted proxy sets it
    # (daphne --proxy-headers does, and then REMOTE_ADDR is the client's).
    return str(getattr(request, "META", {}).get("REMOTE_ADDR", ""))[:45]


def caller_bucket(request: Request) -> str | None:
    """The rate-limit key of an authenticated caller; None for anonymous requests."""
    token = getattr(request, "auth", None)
    if token is not None and hasattr(token, "token_hash"):
        return f"token:{token.pk}"
    user = getattr(request, "user", None)
    if user is not None and getattr(user, "is_authenticated", False) and getattr(user, "pk", None):
        return f"user:{user.pk}"
    return None


# URL names (api/urls.py) of the stop path, never rate limited (see the module docstring).
STOP_PATH = frozenset({"cancel", "takeover", "lease-heartbeat", "lease-release", "drained"})


class CallerRateThrottle(BaseThrottle):
    """SAFESTOP_RATE_LIMIT_PER_MINUTE requests per caller per minute (0 or less: no limit)."""

    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        limit = int(getattr(settings, "SAFESTOP_RATE_LIMIT_PER_MINUTE", 6000))
        bucket = caller_bucket(request)
        if limit <= 0 or bucket is None:
            return True
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name in STOP_PATH:
            return True
        decision = rate_limit_hit(bucket=bucket, limit=limit)
        if decision.allowed:
            return True
        self._wait = max(1.0, math.ceil(decision.retry_after))
        return False

    def wait(self) -> float | None:
        return self._wait


# ---------------------------------------------------------------------------------------------
# guessing bearer tokens

# address -> unix time its block ends; per process (see the module docstring), bounded.
_guessers_blocked: dict[str, float] = {}
_MAX_BLOCKED = 10_000


def bearer_guessing_wait(*, client_ip: str, now: float | None = None) -> float | None:
    """Seconds this address must wait before presenting a bearer token again, or None."""
    until = _guessers_blocked.get(client_ip)
    if until is None:
        return None
    now = time.time() if now is None else now
    if now >= until:
        _guessers_blocked.pop(client_ip, None)
        return None
    return until - now


def bearer_failure_record(*, client_ip: str, now: float | None = None) -> float | None:
    """Count one wrong bearer token from this address. Over the limit: block the address for
    the rest of the window and return the seconds to wait; else None."""
    limit = int(getattr(settings, "SAFESTOP_BAD_TOKEN_LIMIT_PER_MINUTE", 30))
    if limit <= 0:
        return None
    decision = rate_limit_hit(bucket=f"bad-token:{client_ip}"[:64], limit=limit, now=now)
    if decision.allowed:
        return None
    if client_ip not in _guessers_blocked:
        logger.warning(
            "bearer tokens throttled: %s sent %d wrong tokens this minute (limit %d); "
            "answering 429 for %.0f s",
            client_ip or "unknown address",
            decision.hits,
            limit,
            decision.retry_after,
        )
    if len(_guessers_blocked) >= _MAX_BLOCKED:
        _guessers_blocked.clear()  # a flood of addresses: forget, the counters still hold
    _guessers_blocked[client_ip] = (time.time() if now is None else now) + decision.retry_after
    return decision.retry_after


def bearer_guessing_forget() -> None:
    """Lift every block of this process (tests; an operator's shell)."""
    _guessers_blocked.clear()


# ---------------------------------------------------------------------------------------------
# denials


def denial_record(
    *,
    reason: str,
    team_slug: str = "",
    credential: str = "",
    client_ip: str = "",
    route: str = "",
    detail: str = "",
    now: datetime | None = None,
) -> None:
    """Count one denied attempt. Never raises: a broken counter must not turn a 403 into a 500."""
    now = now or timezone.now()
    window_start = now.replace(second=0, microsecond=0)
    ops = connection.ops
    quote = ops.quote_name
    table = quote(Denial._meta.db_table)
    key_columns = ["window_start", "reason", "team_slug", "credential", "client_ip", "route"]
    columns = [*key_columns, "count", "first_at", "last_at", "last_detail"]
    values = [
        ops.adapt_datetimefield_value(window_start),
        reason[:16],
        team_slug[:64],
        credential[:160],
        client_ip[:45],
        route[:120],
        1,
        ops.adapt_datetimefield_value(now),
        ops.adapt_datetimefield_value(now),
        detail[:300],
    ]
    try:
        # A savepoint, so a failed count can never poison a surrounding transaction.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({', '.join(quote(c) for c in columns)}) "
                f"VALUES ({', '.join(['%s'] * len(columns))}) "
                f"ON CONFLICT ({', '.join(quote(c) for c in key_columns)}) DO UPDATE SET "
                f"{quote('count')} = {table}.{quote('count')} + 1, "
                f"{quote('last_at')} = EXCLUDED.{quote('last_at')}, "
                f"{quote('last_detail')} = EXCLUDED.{quote('last_detail')}",
                values,
            )
    except Exception:
        logger.exception("could not count a denied API attempt (%s)", reason)


def denials_list(
    *, team_slugs: list[str] | None, since: datetime, until: datetime, limit: int = 500
) -> dict[str, Any]:
    """Denials in [since, until), newest first; `team_slugs=None` means every team and none."""
    rows = Denial.objects.filter(last_at__gte=since, window_start__lt=until)
    if team_slugs is not None:
        rows = rows.filter(team_slug__in=team_slugs)
    by_reason = {
        row["reason"]: row["n"] for row in rows.order_by().values("reason").annotate(n=Sum("count"))
    }
    return {
        "since": since,
        "until": until,
        "total": sum(by_reason.values()),
        "by_reason": by_reason,
        "results": list(rows.order_by("-last_at", "-id")[:limit]),
    }


def denial_counts(*, since: datetime, team_slugs: list[str] | None) -> dict[str, int]:
    """Denied attempts per reason since `since`; `team_slugs=None` means every team and none
    (bad tokens and throttled guessers name no team)."""
    rows = Denial.objects.filter(last_at__gte=since)
    if team_slugs is not None:
        rows = rows.filter(team_slug__in=team_slugs)
    return {
        row["reason"]: row["n"] for row in rows.order_by().values("reason").annotate(n=Sum("count"))
    }
