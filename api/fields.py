"""Serializer fields that accept exactly what the OpenAPI schema says: clients generated from
the schema must never be refused, and nothing the schema does not describe may be stored.

DRF's fields coerce: a CharField takes the number 12 as "12", an IntegerField takes "12" and
12.0, a BooleanField takes "yes", 1 and "on". The schema says `string`, `integer`, `boolean`,
so a client reading it would be told the wrong contract, and a typo in a client (a number
sent for an id) passes silently. These fields refuse the other JSON types with a 400.

Query strings are text by nature: the query serializers keep DRF's parsing of their values.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

# A CharField trims surrounding whitespace (`str.strip()`) before its blank check, so "  " is
# refused as blank: the schema says so with a pattern (unanchored: one character that is not
# whitespace, anywhere). Spelled out, because JSON Schema's `\s` is ECMAScript's, which lacks
# U+001C..U+001F that `str.strip()` removes.
WHITESPACE = "".join(chr(code) for code in range(0x3001) if chr(code).isspace())
WHITESPACE_ESCAPED = "".join(f"\\u{ord(char):04x}" for char in WHITESPACE)
NOT_ONLY_WHITESPACE = f"[^{WHITESPACE_ESCAPED}]"


class StrictCharField(serializers.CharField):
    default_error_messages = {"invalid": "Not a valid string: a string is required."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A valid integer is required (a JSON number)."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    default_error_messages = {"invalid": "A valid number is required (a JSON number)."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be true or false (a JSON boolean)."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


@extend_schema_field(
    {
        "oneOf": [
            {"type": "object", "additionalProperties": True},
            {"type": "array", "items": {}},
            {"type": "string"},
            {"type": "number"},
            {"type": "boolean"},
        ],
        "description": "any JSON value but null",
    }
)
class JSONValueField(serializers.JSONField):
    """Any JSON value except null (which DRF refuses unless `allow_null`)."""


class TrimmedCharFieldExtension(OpenApiSerializerFieldExtension):
    """Adds NOT_ONLY_WHITESPACE to the request schema of a trimmed, non-blank string."""

    target_class = StrictCharField
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer_field(
            self.target, direction, bypass_extensions=True
        )
        field = self.target
        # A field with its own RegexValidator gets that pattern from drf-spectacular later.
        own_pattern = any(isinstance(check, RegexValidator) for check in field.validators)
        if (
            direction == "request"
            and field.trim_whitespace
            and not field.allow_blank
            and not own_pattern
            and "pattern" not in schema
        ):
            schema["pattern"] = NOT_ONLY_WHITESPACE
        return schema


@extend_schema_field({"type": "object", "additionalProperties": True, "nullable": True})
class JSONObjectOrNullField(serializers.JSONField):
    """A JSON object or null; the serializer refuses anything else with its own message."""
