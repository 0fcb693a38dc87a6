"""Every API error is JSON `{"error": <stable code>, "detail": ..., ...}`."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from runs.errors import DomainError

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
}


def _first_field_error(detail: Any, prefix: str = "") -> tuple[str, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            field = f"{prefix}.{key}" if prefix else str(key)
            if key == "non_field_errors":
                field = prefix
            return _first_field_error(value, field)
    if isinstance(detail, list) and detail:
        for index, value in enumerate(detail):
            if value:
                nested = f"{prefix}[{index}]" if isinstance(value, dict | list) and prefix else prefix
                return _first_field_error(value, nested if isinstance(value, dict | list) else prefix)
    return prefix, str(detail)


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(exc.as_dict(), status=exc.http_status)
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = next((value for cls, value in _CODES.items() if isinstance(exc, cls)), "error")
    body: dict[str, Any] = {"error": code}
    if isinstance(exc, exceptions.ValidationError):
        field, message = _first_field_error(exc.detail)
        body["detail"] = f"{field}: {message}" if field else message
        if field:
            body["field"] = field
        body["errors"] = exc.detail
    else:
        body["detail"] = str(getattr(exc, "detail", exc))
    if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        response["Retry-After"] = str(int(exc.wait) + 1)
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = "Bearer"
    response.data = body
    return response
