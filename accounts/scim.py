"""A small SCIM 2.0 endpoint (RFC 7643/7644) for the IdP's provisioning: find a user, read it,
and deactivate or reactivate it. Users are created by their first sign-in (keyed by issuer and
subject), so there is no POST; an IdP that tries gets a 405 SCIM error saying so.

Both request shapes the big IdPs send for "deactivate" are accepted:
- Entra ID: `{"Operations": [{"op": "Replace", "path": "active", "value": "False"}]}`
- Okta: `{"Operations": [{"op": "replace", "value": {"active": false}}]}`

Auth: `Authorization: Bearer <SAFESTOP_SCIM_TOKEN>`; without the setting the endpoint answers
404 (off). Errors are SCIM error bodies with a 4xx status, never a 500.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from django.contrib.auth import get_user_model
from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from django.views.decorators.csrf import csrf_exempt

from accounts import conf
from accounts.models import IdentityLink
from accounts.services import user_deactivate, user_reactivate
from runs.actors import Actor

logger = logging.getLogger("safestop.scim")

SCIM_USER = "urn:ietf:params:scim:schemas:core:2.0:User"
SCIM_LIST = "urn:ietf:params:scim:api:messages:2.0:ListResponse"
SCIM_ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
SCIM_PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
CONTENT_TYPE = "application/scim+json"
SCIM_ACTOR = Actor.system("scim")
MAX_PAGE = 200
# `userName eq "value"`: the one filter IdPs send to find an account (attribute names and
# operators are case-insensitive, RFC 7644 §3.4.2.2).
_FILTER = re.compile(r'^\s*userName\s+eq\s+"((?:[^"\\]|\\.)*)"\s*$', re.IGNORECASE)


class ScimError(Exception):
    def __init__(self, status: int, detail: str, scim_type: str = "") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.scim_type = scim_type


def _answer(body: dict[str, Any], status: int = 200) -> HttpResponse:
    return HttpResponse(json.dumps(body), status=status, content_type=CONTENT_TYPE)


def _error(exc: ScimError) -> HttpResponse:
    body: dict[str, Any] = {
        "schemas": [SCIM_ERROR],
        "status": str(exc.status),
        "detail": exc.detail,
    }
    if exc.scim_type:
        body["scimType"] = exc.scim_type
    logger.warning(
        "scim.refused status=%s type=%s detail=%s", exc.status, exc.scim_type, exc.detail
    )
    return _answer(body, exc.status)


def _authorise(request: HttpRequest) -> None:
    expected = conf.scim_token()
    if not expected:
        raise ScimError(404, "SCIM is not enabled (SAFESTOP_SCIM_TOKEN is not set)")
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not constant_time_compare(given.strip(), expected):
        raise ScimError(401, "a valid bearer token is required")


def _user_body(request: HttpRequest, user: Any, links: dict[int, str]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schemas": [SCIM_USER],
        "id": str(user.pk),
        "userName": user.get_username(),
        "active": bool(user.is_active),
        "name": {"givenName": user.first_name, "familyName": user.last_name},
        "displayName": user.get_full_name() or user.get_username(),
        "meta": {
            "resourceType": "User",
            "location": request.build_absolute_uri(f"/scim/v2/Users/{user.pk}"),
        },
    }
    if user.email:
        body["emails"] = [{"value": user.email, "primary": True}]
    if user.pk in links:
        body["externalId"] = links[user.pk]
    return body


def _links(user_ids: list[int]) -> dict[int, str]:
    return dict(
        IdentityLink.objects.filter(user_id__in=user_ids, issuer=conf.issuer()).values_list(
            "user_id", "subject"
        )
    )


def _json_body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, UnicodeDecodeError):
        raise ScimError(400, "the body is not JSON", "invalidSyntax") from None
    if not isinstance(body, dict):
        raise ScimError(400, "the body must be a JSON object", "invalidSyntax")
    return body


def _as_bool(value: Any) -> bool:
    """`active` as a JSON boolean, or the string Entra ID sends ("True" / "False")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in {"true", "false"}:
        return value.strip().lower() == "true"
    raise ScimError(400, f"active must be a boolean, not {value!r}", "invalidValue")


def _active_from_patch(body: dict[str, Any]) -> bool | None:
    """What a PatchOp says about `active` (None: nothing). Operations on attributes safestop
    does not keep (name, emails, ...) are accepted and ignored: the IdP owns them."""
    operations = body.get("Operations")
    if not isinstance(operations, list) or not operations:
        raise ScimError(400, "Operations must be a non-empty list", "invalidSyntax")
    active: bool | None = None
    for operation in operations:
        if not isinstance(operation, dict):
            raise ScimError(400, "each operation must be an object", "invalidSyntax")
        op = str(operation.get("op", "")).lower()
        if op not in {"replace", "add", "remove"}:
            raise ScimError(400, f"unsupported op {operation.get('op')!r}", "invalidSyntax")
        path = operation.get("path")
        value = operation.get("value")
        if path is not None and not isinstance(path, str):
            raise ScimError(400, "path must be a string", "invalidPath")
        if path is not None and path.strip().lower() == "active":
            if op == "remove":
                raise ScimError(400, "active cannot be removed", "mutability")
            active = _as_bool(value)
        elif path is None:
            if not isinstance(value, dict):
                raise ScimError(
                    400, "an operation without a path needs an object value", "invalidValue"
                )
            for key, item in value.items():
                if key.lower() == "active":
                    active = _as_bool(item)
    return active


def _set_active(user_id: int, active: bool) -> None:
    if active:
        user_reactivate(user_id=user_id, actor=SCIM_ACTOR, via="scim")
    else:
        user_deactivate(user_id=user_id, actor=SCIM_ACTOR, via="scim")


@csrf_exempt
def users(request: HttpRequest) -> HttpResponse:
    """`/scim/v2/Users`: GET lists (or finds, with `filter=userName eq "x"`)."""
    try:
        _authorise(request)
        if request.method == "POST":
            raise ScimError(
                405, "users are created by their first sign-in through the identity provider"
            )
        if request.method != "GET":
            raise ScimError(405, f"{request.method} is not supported here")
        User = get_user_model()
        queryset = User.objects.order_by("pk")
        raw_filter = request.GET.get("filter")
        if raw_filter is not None:
            match = _FILTER.match(raw_filter)
            if match is None:
                raise ScimError(
                    400, 'only `userName eq "value"` filters are supported', "invalidFilter"
                )
            name = re.sub(r"\\(.)", r"\1", match.group(1))
            queryset = queryset.filter(username__iexact=name)
        try:
            start = max(1, int(request.GET.get("startIndex", 1)))
            count = min(MAX_PAGE, max(0, int(request.GET.get("count", 100))))
        except ValueError:
            raise ScimError(400, "startIndex and count must be integers", "invalidValue") from None
        total = queryset.count()
        page = list(queryset[start - 1 : start - 1 + count])
        links = _links([user.pk for user in page])
        return _answer(
            {
                "schemas": [SCIM_LIST],
                "totalResults": total,
                "startIndex": start,
                "itemsPerPage": len(page),
                "Resources": [_user_body(request, user, links) for user in page],
            }
        )
    except ScimError as exc:
        return _error(exc)


@csrf_exempt
def user(request: HttpRequest, user_id: str) -> HttpResponse:
    """`/scim/v2/Users/<id>`: GET, PATCH (active), PUT (active)."""
    try:
        _authorise(request)
        if request.method not in {"GET", "PATCH", "PUT"}:
            raise ScimError(405, f"{request.method} is not supported here")
        User = get_user_model()
        found = User.objects.filter(pk=int(user_id)).first() if user_id.isdigit() else None
        if found is None:
            raise ScimError(404, f"no user {user_id}")
        if request.method == "PATCH":
            body = _json_body(request)
            if SCIM_PATCH not in (body.get("schemas") or [SCIM_PATCH]):
                raise ScimError(400, f"schemas must include {SCIM_PATCH}", "invalidSyntax")
            active = _active_from_patch(body)
            if active is not None:
                _set_active(found.pk, active)
        elif request.method == "PUT":
            body = _json_body(request)
            if "active" in body:
                _set_active(found.pk, _as_bool(body["active"]))
        found.refresh_from_db()
        return _answer(_user_body(request, found, _links([found.pk])))
    except ScimError as exc:
        return _error(exc)
