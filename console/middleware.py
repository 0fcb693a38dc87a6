"""HTTP middleware of our own."""

from __future__ import annotations

import logging
import zoneinfo
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.middleware.locale import LocaleMiddleware
from django.utils import timezone, translation
from django.views.defaults import page_not_found, permission_denied

from accounts.services import SESSION_LANGUAGE, user_time_zone_cached
from api.errors import (
    DATABASE_RETRY_AFTER_SECONDS,
    DATABASE_UNAVAILABLE,
    database_unavailable,
    refusals,
)

logger = logging.getLogger(__name__)


class SyncMiddlewareChain:
    """Innermost middleware, sync only: it makes Django run the whole middleware chain in one
    thread under ASGI.

    Under ASGI Django runs an async-capable middleware (every `MiddlewareMixin` one) in async
    mode, and each of those hops to a worker thread for its `process_request` and again for its
    `process_response`: about a dozen thread hops per request with our stack, most of the cost
    of a request that does nothing (docs/BENCHMARKS.md, the HTTP floor). Django keeps every
    middleware outside a sync-only one in sync mode, so with this one last the chain costs one
    hop in, one back to the loop for the URL resolver, and one to the (sync) view.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)


API_PREFIX = "/api/"
# The `error` code of an answer under /api/ that did not come from the API's own handler.
_API_CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
    503: "unavailable",
}
# Headers of the original answer that still mean something on its JSON replacement.
_KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate", "Vary")


class ErrorAnswers:
    """Second in `MIDDLEWARE` (inside SecurityMiddleware, so its headers still apply):

    1. Every error answer under `/api/` is JSON with an `error` code, whoever made it: Django's
       CSRF refusal, the 400 of a bad Host header, a 404 of the resolver, a 500 page.
    2. A view that cannot reach the database (a restart, a failover, `pg_terminate_backend`)
       answers 503 with `Retry-After` — JSON under `/api/`, text on the console — instead of a
       500 with a traceback; the pool replaces the dead connection for the next request.
    3. A refused console request (`PermissionDenied`) is one log line with the reason and the
       user, at INFO, not a traceback: a 403 is the access rules working.
    4. A path with a NUL byte is a 404 before any view runs: no key in the database can hold
       one (PostgreSQL text cannot), and a view querying with it would fail there instead of
       answering "no such thing" — for every `<str:...>` pattern, present and future.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response: HttpResponse
        if "\x00" in request.path_info:
            response = page_not_found(request, Http404("no such page"))
        else:
            response = self.get_response(request)
        if (
            request.path_info.startswith(API_PREFIX)
            and response.status_code >= 400
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            return _as_json(response)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if database_unavailable(exception):
            logger.warning(
                "database unavailable (%s %s): %s",
                request.method,
                request.path,
                (str(exception).strip().splitlines() or [type(exception).__name__])[0],
            )
            response: HttpResponse
            if request.path_info.startswith(API_PREFIX):
                response = JsonResponse(DATABASE_UNAVAILABLE, status=503)
            else:
                response = HttpResponse(
                    "The database cannot be reached right now. Try again in a few seconds.\n",
                    status=503,
                    content_type="text/plain; charset=utf-8",
                )
            response["Retry-After"] = str(DATABASE_RETRY_AFTER_SECONDS)
            response._has_been_logged = True  # type: ignore[attr-defined]
            return response
        if isinstance(exception, PermissionDenied):
            user = getattr(request, "user", None)
            who = user.get_username() if user is not None and user.is_authenticated else "anonymous"
            refusals.info(
                "refused 403 %s %s: %s by %s", request.method, request.path, exception, who
            )
            response = permission_denied(request, exception)
            response._has_been_logged = True  # type: ignore[attr-defined]
            return response
        return None


def _as_json(response: HttpResponse) -> HttpResponse:
    status = response.status_code
    code = _API_CODES.get(status, "server_error" if status >= 500 else "error")
    detail = response.reason_phrase or code
    replacement = JsonResponse({"error": code, "detail": detail}, status=status)
    for header in _KEPT_HEADERS:
        if header in response:
            replacement[header] = response[header]
    if getattr(response, "_has_been_logged", False):
        replacement._has_been_logged = True  # type: ignore[attr-defined]
    return replacement


# Chinese tags Django's own Accept-Language lookup does not send to zh-hans by itself: a bare
# `zh` (most browsers set to Chinese send `zh-CN,zh`, some only `zh`) and the regions that
# write Simplified Chinese.
LANGUAGE_CODES = frozenset(code for code, _name in settings.LANGUAGES)
SIMPLIFIED_CHINESE_TAGS = frozenset({"zh", "zh-cn", "zh-sg", "zh-my", "zh-hans", "zh-hans-cn"})


def language_from_accept_header(header: str) -> str | None:
    """zh-hans when the browser's first Chinese-or-English choice is Simplified Chinese."""
    from django.utils.translation import get_supported_language_variant
    from django.utils.translation.trans_real import parse_accept_lang_header

    for tag, _quality in parse_accept_lang_header(header):
        tag = tag.lower()
        if tag in SIMPLIFIED_CHINESE_TAGS:
            return "zh-hans"
        if tag == "*":
            return None
        try:
            return get_supported_language_variant(tag)
        except LookupError:
            continue
    return None


def _session_value(request: HttpRequest, key: str) -> Any:
    """A value saved in the session (the language, the time zone), or None. Reading it loads the session: with the
    database down that raises here, in a middleware, where the outage answer (a 503 from the
    view's first query) cannot catch it; the request goes on in the default language instead."""
    session = getattr(request, "session", None)
    if session is None:
        return None
    try:
        return session.get(key)
    except DatabaseError:
        return None


def _user_time_zone(request: HttpRequest) -> str | None:
    """The signed-in user's team time zone (cached, forgotten when it changes), or None. As with
    the session, a database outage here means the default (UTC), not a middleware crash."""
    user = getattr(request, "user", None)
    try:
        if user is None or not user.is_authenticated:
            return None
        return user_time_zone_cached(user=user)
    except DatabaseError:
        return None


class UserLocale(LocaleMiddleware):
    """The language and time zone of one request.

    Language: the signed-in user's own choice (saved on the user, copied into the session at
    sign-in and when they switch), else the language cookie (the sign-in page's switch), else
    the browser's Accept-Language, else English. Time zone: the user's team's (cached per user
    and forgotten when an admin changes it, `accounts.services.user_time_zone_cached`), else UTC.
    """

    def process_request(self, request: HttpRequest) -> None:
        chosen = _session_value(request, SESSION_LANGUAGE)
        language = chosen if chosen in LANGUAGE_CODES else None
        if language is None:
            cookie = request.COOKIES.get(settings.LANGUAGE_COOKIE_NAME)
            language = cookie if cookie in LANGUAGE_CODES else None
        if language is None:
            language = (
                language_from_accept_header(request.headers.get("Accept-Language", ""))
                or settings.LANGUAGE_CODE
            )
        translation.activate(language)
        request.LANGUAGE_CODE = translation.get_language()  # type: ignore[attr-defined]
        zone = _user_time_zone(request)
        if zone:
            try:
                timezone.activate(zoneinfo.ZoneInfo(zone))
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                timezone.deactivate()
        else:
            timezone.deactivate()

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        response = super().process_response(request, response)
        timezone.deactivate()
        return response
