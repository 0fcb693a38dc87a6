"""Every API error is JSON `{"error": <stable code>, "detail": ..., ...}`.

- a domain refusal (`runs.errors.DomainError`) keeps its code and, for a 409, the run's current
  `status` and `stop_epoch`;
- a validation error names the first bad field in `field` (`events[3].event_id`), with all
  of them in `errors`;
- 401 / 403 / 404 / 413 / 415 / 429 carry their own codes; 429 adds `Retry-After`;
- a database that cannot be reached is a 503 `database_unavailable` with `Retry-After`;
- every refusal is one log line with the reason and the caller, never a traceback;
- denied attempts (bad token, another team's run, wrong role) are counted on the way out.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from api.parsers import RequestTooLarge
from runs.errors import DomainError

logger = logging.getLogger(__name__)
# Refused requests (401, 403, 404, 429, ...): one line each, at INFO (WARNING for bad
# credentials and throttling), never a traceback.
refusals = logging.getLogger("safestop.refusals")

_CODES = {
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.Throttled: "rate_limited",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.ParseError: "parse_error",
    exceptions.ValidationError: "invalid",
    exceptions.NotAcceptable: "not_acceptable",
    RequestTooLarge: "request_too_large",
}


def _first_field_error(detail: Any, prefix: str = "") -> tuple[str, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            if isinstance(key, int):  # DRF keys a list serializer's item errors by index
                field = f"{prefix}[{key}]"
            else:
                field = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                field = prefix
            return _first_field_error(value, field)
    if isinstance(detail, list) and detail:
        for index, value in enumerate(detail):
            if value:
                nested = (
                    f"{prefix}[{index}]" if isinstance(value, dict | list) and prefix else prefix
                )
                return _first_field_error(
                    value, nested if isinstance(value, dict | list) else prefix
                )
    return prefix, str(detail)


# How long a client should wait when the database cannot be reached (a restart, a failover).
DATABASE_RETRY_AFTER_SECONDS = 5


def database_unavailable(exc: BaseException) -> bool:
    """The database could not be reached or dropped the connection: worth a retry, not a 500.
    (A pool timeout is an OperationalError too: every connection busy or being replaced.)"""
    return isinstance(exc, OperationalError | InterfaceError)


DATABASE_UNAVAILABLE = {
    "error": "database_unavailable",
    "detail": "the database is not reachable right now; retry after the wait",
}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    request = context.get("request")
    if isinstance(exc, DomainError):
        answer = Response(exc.as_dict(), status=exc.http_status)
        retry_after = exc.extra.get("retry_after")
        if isinstance(retry_after, int | float):
            answer["Retry-After"] = str(max(1, math.ceil(retry_after)))
        return answer
    if database_unavailable(exc):
        logger.warning("database unavailable: %s", (str(exc).strip().splitlines() or [""])[0])
        unavailable = Response(DATABASE_UNAVAILABLE, status=503)
        unavailable["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
        return unavailable
    if isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(str(exc) or None)
    _count_denial(exc, request, context.get("view"))
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = next((value for cls, value in _CODES.items() if isinstance(exc, cls)), None)
    if code is None:
        code = getattr(exc, "default_code", "error")
    body: dict[str, Any] = {"error": code}
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_field_error(exc.detail)
        body["detail"] = f"{field}: {message}" if field else message
        if field:
            body["field"] = field
        body["errors"] = exc.detail
    else:
        body["detail"] = str(getattr(exc, "detail", exc))
    wait = getattr(exc, "wait", None) if isinstance(exc, exceptions.Throttled) else None
    if wait is not None:
        response["Retry-After"] = str(max(1, math.ceil(wait)))
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = "Bearer"
    response.data = body
    _log_refusal(request, context.get("view"), response, code, body["detail"])
    return response


def _log_refusal(request: Any, view: Any, response: Response, code: str, detail: str) -> None:
    """One line per refused request, with who and why; no traceback (a refusal is the API
    working). Marked logged, so Django's request logger does not add a second line."""
    caller = getattr(view, "caller", None)
    who = caller.actor.name if caller is not None else "anonymous"
    level = logging.WARNING if response.status_code in (401, 429) else logging.INFO
    path = getattr(request, "path", "")
    method = getattr(request, "method", "")
    refusals.log(
        level,
        "refused %s %s %s: %s (%s) by %s",
        response.status_code,
        method,
        path,
        code,
        detail[:200],
        who,
    )
    response._has_been_logged = True  # type: ignore[attr-defined]


def _count_denial(exc: Exception, request: Any, view: Any) -> None:
    from api.auth import TokenGuessingThrottled
    from api.permissions import WrongRole, WrongTeam
    from api.ratelimit import client_address, denial_record

    if isinstance(exc, exceptions.AuthenticationFailed):
        reason, team_slug, credential = "bad_token", *_presented_token(request)
    elif isinstance(exc, TokenGuessingThrottled):
        reason, team_slug, credential = "throttled", "", ""
    elif isinstance(exc, WrongTeam | WrongRole):
        caller = getattr(view, "caller", None)
        reason = "wrong_team" if isinstance(exc, WrongTeam) else "wrong_role"
        credential = caller.credential if caller is not None else ""
        token = getattr(caller, "token", None)
        team_slug = token.team.slug if token is not None else ""
    else:
        return
    match = getattr(request, "resolver_match", None)
    denial_record(
        reason=reason,
        team_slug=team_slug,
        credential=credential,
        client_ip=client_address(request),
        route=(match.route if match is not None else ""),
        detail=str(getattr(exc, "detail", "")),
    )


def _presented_token(request: Any) -> tuple[str, str]:
    """Name a refused token only if it is one of ours (revoked, say); never echo attacker text."""
    from runs.models import ApiToken
    from runs.tokens import TOKEN_PREFIX, hash_token

    header = request.META.get("HTTP_AUTHORIZATION", "") if request is not None else ""
    parts = header.split()
    raw = parts[1] if len(parts) == 2 else ""
    if not raw.startswith(TOKEN_PREFIX):
        return "", "malformed"
    token = ApiToken.objects.select_related("team").filter(token_hash=hash_token(raw)).first()
    if token is None:
        return "", "unknown"
    state = "revoked" if token.revoked_at is not None else "refused"
    return token.team.slug, f"{state} token:{token.name}"


@csrf_exempt  # a POST to a path that does not exist is a 404, not a CSRF refusal
def json_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Unknown paths under /api/: JSON, like every other API answer."""
    detail = "no such API endpoint"
    if not request.path_info.endswith("/"):
        try:
            match = resolve(request.path_info + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not json_not_found:
            detail = f"no such API endpoint; every API path ends with '/': {request.path}/"
    return JsonResponse({"error": "not_found", "detail": detail}, status=404)
