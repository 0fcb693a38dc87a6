"""The hot path of `POST /api/v1/runs/{id}/events/`, for the request agents send all day.

A well-formed batch from a valid agent token is answered here without DRF's request wrapping,
content negotiation, serializers and renderer, and without a token lookup: in the bench's
profile those cost more than the batch's own database work (docs/BENCHMARKS.md). Anything
else — another credential, a malformed or unusual body, an unknown run,
another team's run, a rate limit reached, a token revoked since it was cached — returns None
and `EventsView` answers through DRF exactly as before: same status codes, same error bodies,
same denial counters. The answers of the two paths are the same bytes for the same input.

Tokens are cached per process (raw token's hash → id, team, role). The cache never decides
alone: `runs.services.events_ingest` re-reads the token in the statement that locks the run
(`TokenCheck`), so a revoked token writes nothing, at once, in every process; this process
also forgets it when `runs.notify.token_revoked` fires.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from rest_framework.exceptions import APIException

from api.agent_version import ClientTooOld, check_agent_version
from api.parsers import make_storable
from api.permissions import Caller, run_id_for
from api.ratelimit import bearer_guessing_wait, client_address, rate_limit_hit
from api.serializers import INT32_MAX, MAX_EVENTS_PER_BATCH
from runs import notify, services
from runs.access import Capability, Grants
from runs.actors import Actor
from runs.models import ApiToken
from runs.services.events import TokenCheck, TokenNoLongerValid
from runs.tokens import TOKEN_PREFIX, api_token_authenticate, hash_token

# Seconds between two writes of a token's `last_used_at`, as `api_token_authenticate` does.
LAST_USED_EVERY = 60.0
_MAX_TOKENS = 1024


@dataclass
class _CachedToken:
    caller: Caller
    check: TokenCheck
    last_used: float  # time.monotonic() of the last `last_used_at` write


class TokenCache:
    """Hash of a raw token → what the events hot path needs to know about it, bounded (LRU)."""

    def __init__(self, size: int = _MAX_TOKENS) -> None:
        self._size = size
        self._tokens: OrderedDict[str, _CachedToken] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, raw: str) -> _CachedToken | None:
        digest = hash_token(raw)
        with self._lock:
            entry = self._tokens.get(digest)
            if entry is not None:
                self._tokens.move_to_end(digest)
        if entry is None:
            entry = self._load(raw, digest)
        elif time.monotonic() - entry.last_used > LAST_USED_EVERY:
            entry.last_used = time.monotonic()
            ApiToken.objects.filter(pk=entry.check.token_id).update(last_used_at=_now())
        return entry

    def _load(self, raw: str, digest: str) -> _CachedToken | None:
        token = api_token_authenticate(raw)  # records last_used_at
        if token is None:
            return None
        entry = _CachedToken(
            caller=Caller(
                actor=Actor.for_token(token),
                token=token,
                grants=Grants.for_token(team_id=token.team_id, role=token.role),
            ),
            check=TokenCheck(token_id=token.pk, team_id=token.team_id, role=token.role),
            last_used=time.monotonic(),
        )
        with self._lock:
            self._tokens[digest] = entry
            while len(self._tokens) > self._size:
                self._tokens.popitem(last=False)
        return entry

    def forget(self, token_id: int) -> None:
        with self._lock:
            for digest in [d for d, e in self._tokens.items() if e.check.token_id == token_id]:
                del self._tokens[digest]

    def clear(self) -> None:
        with self._lock:
            self._tokens.clear()

    def __len__(self) -> int:
        return len(self._tokens)


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


tokens = TokenCache()


def _on_run_change(event: dict[str, Any]) -> None:
    if event.get("kind") == "token_revoked":
        tokens.forget(int(event["token_id"]))


notify.subscribe(_on_run_change)


# ---------------------------------------------------------------------------------------------
# the request


def events_fast(request: HttpRequest, run_id: str) -> HttpResponse | None:
    """The answer to a plain events batch, or None: let DRF answer it (see the module)."""
    raw = _bearer(request)
    if raw is None or bearer_guessing_wait(client_ip=client_address(request)) is not None:
        return None
    try:
        check_agent_version(request.META)
    except ClientTooOld:
        return None
    body = _body(request)
    if body is None:
        return None
    cached = tokens.get(raw)
    if cached is None or not _may_work(cached.caller, run_id) or not _under_rate_limit(cached):
        return None
    epoch, events = body
    try:
        answers = services.events_ingest(
            run_id=run_id,
            epoch=epoch,
            events=events,
            actor=cached.caller.actor,
            token_check=cached.check,
        )
    except TokenNoLongerValid:
        tokens.forget(cached.check.token_id)
        return None
    return _answer([answer.as_dict() for answer in answers])


def _bearer(request: HttpRequest) -> str | None:
    if request.method != "POST" or request.META.get("QUERY_STRING") or not _accepts_json(request):
        return None
    parts = request.META.get("HTTP_AUTHORIZATION", "").split()
    if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1].startswith(TOKEN_PREFIX):
        return None
    return parts[1]


def _accepts_json(request: HttpRequest) -> bool:
    """What DRF's content negotiation would answer with its one renderer (else a 406)."""
    accept = request.META.get("HTTP_ACCEPT", "")
    if not accept:
        return True
    if ";" in accept:  # e.g. `application/json; indent=4`, which DRF's renderer honours
        return False
    media = {part.split(";")[0].strip() for part in accept.split(",")}
    return bool(media & {"*/*", "application/*", "application/json"})


def _body(request: HttpRequest) -> tuple[int, list[dict[str, Any]]] | None:
    """(epoch, events) of a body every event of which DRF's `EventsIn` / `EventIn` would take
    as it is; None for anything else, which DRF then answers (400, 413, 415, or a rejection)."""
    if request.content_type != "application/json" or (request.encoding or "utf-8").lower() not in (
        "utf-8",
        "utf8",
    ):
        return None
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or -1)
    except ValueError:
        return None
    if declared < 0 or (limit is not None and declared > limit):
        return None
    try:
        data = make_storable(json.loads(request.body.decode("utf-8"), parse_constant=_refuse))
    except Exception:  # malformed, too deep, not finite: DRF's parser says which
        return None
    if not isinstance(data, dict):
        return None
    epoch, events = data.get("epoch"), data.get("events")
    if type(epoch) is not int or not 0 <= epoch <= INT32_MAX:
        return None
    if not isinstance(events, list) or not 0 < len(events) <= MAX_EVENTS_PER_BATCH:
        return None
    if not all(_plain_event(event) for event in events):
        return None
    return epoch, events


def _refuse(name: str) -> Any:
    raise ValueError(name)


def _plain_event(event: Any) -> bool:
    """An event whose identity fields pass `EventIn` unchanged (no trimming, no coercion)."""
    if not isinstance(event, dict):
        return False
    event_id, kind = event.get("event_id"), event.get("type")
    return (
        type(event_id) is str
        and 0 < len(event_id) <= 120
        and event_id.strip() == event_id
        and type(kind) is str
        and 0 < len(kind) <= 40
        and kind.strip() == kind
        and "step_seq" not in event
        and "steering_id" not in event
    )


def _may_work(caller: Caller, run_id: str) -> bool:
    try:
        run_id_for(caller, run_id, Capability.WORK)
    except APIException:  # 404 / 403: DRF answers and counts the denial
        return False
    return True


def _under_rate_limit(cached: _CachedToken) -> bool:
    limit = int(getattr(settings, "SAFESTOP_RATE_LIMIT_PER_MINUTE", 6000))
    if limit <= 0:
        return True
    # Over the limit: DRF's throttle counts once more and answers 429 with Retry-After.
    return rate_limit_hit(bucket=f"token:{cached.check.token_id}", limit=limit).allowed


def _answer(results: list[dict[str, Any]]) -> HttpResponse:
    counts = {"accepted": 0, "duplicate": 0, "rejected": 0}
    for result in results:
        counts[result["status"]] += 1
    # DRF's JSONRenderer output for the same data (compact, UTF-8), with the header its
    # APIView adds, so a client cannot tell which path answered.
    body = json.dumps({"results": results, **counts}, ensure_ascii=False, separators=(",", ":"))
    body = body.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    response = HttpResponse(body.encode(), content_type="application/json")
    response["Allow"] = "POST, OPTIONS"
    return response
