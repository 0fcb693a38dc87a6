"""How the API describes itself in OpenAPI: the bearer-token scheme (drf-spectacular cannot
infer a custom one) and the query-string rule every API view shares."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer

# Also registers the schema extension of the strict string field.
from api.fields import NOT_ONLY_WHITESPACE, WHITESPACE_ESCAPED

# A NUL in a JSON body is stored as U+FFFD (api.parsers), but a query string value with
# one is refused (Django's CharField: "Null characters are not allowed"), so a string query
# parameter's pattern excludes it.
QUERY_TEXT = r"^[^\u0000]*$"
QUERY_TEXT_NOT_BLANK = rf"^[^\u0000]*[^{WHITESPACE_ESCAPED}\u0000][^\u0000]*$"


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token made by `manage.py create_api_token --team T --name N --role agent|reviewer`.",
        }


class ApiAutoSchema(AutoSchema):
    """Every optional query parameter of the API reads an empty value (`?status=`) as not
    given — DRF's parsing of a query string, and the pagination's — so the schema says so
    (`allowEmptyValue`), and a client may send a blank filter as it is."""

    def _process_override_parameters(self, direction: str = "request") -> dict[Any, Any]:
        parameters: dict[Any, Any] = super()._process_override_parameters(direction)
        for (_, location), parameter in parameters.items():
            if location != OpenApiParameter.QUERY or parameter is None:
                continue
            if not parameter.get("required"):
                parameter["allowEmptyValue"] = True
            _no_nul_in_query_text(parameter["schema"])
        return parameters

    def _get_request_for_media_type(self, serializer: Any, direction: str = "request") -> Any:
        # drf-spectacular reads "required" off a plain serializer's fields only; a body that is
        # one of several shapes (PolymorphicProxySerializer) is just as required.
        schema, required = super()._get_request_for_media_type(serializer, direction)
        return schema, required or isinstance(serializer, PolymorphicProxySerializer)

    def _map_basic_serializer(self, serializer: Any, direction: str) -> dict[str, Any]:
        # An input serializer that refuses unknown fields by name (`closed = True`) says so.
        schema: dict[str, Any] = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and getattr(serializer, "closed", False):
            schema["additionalProperties"] = False
        return schema


def _no_nul_in_query_text(schema: dict[str, Any]) -> None:
    if schema.get("type") != "string" or "enum" in schema or "format" in schema:
        return
    pattern = schema.get("pattern")
    if pattern is None:
        schema["pattern"] = QUERY_TEXT
    elif pattern == NOT_ONLY_WHITESPACE:
        schema["pattern"] = QUERY_TEXT_NOT_BLANK
