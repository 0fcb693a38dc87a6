"""The one JSON parser of the API: bounded, strict, and storable.

DRF's JSONParser reads the raw stream (Django's DATA_UPLOAD_MAX_MEMORY_SIZE check lives in
`HttpRequest.body`, which DRF bypasses), lets `RecursionError` escape on deeply nested input,
turns `1e400` into `inf`, and passes on strings PostgreSQL cannot store. Each of those would
be a 500 further down. Here:

1. a body over DATA_UPLOAD_MAX_MEMORY_SIZE is refused with 413 before it is read in full;
2. malformed JSON, non-UTF-8 bytes, NaN/Infinity, overflowing numbers and nesting deeper than
   MAX_DEPTH are a 400 `parse_error`;
3. NUL characters and lone surrogates (neither fits a PostgreSQL text or jsonb value) are
   replaced by U+FFFD, so a tool's binary-ish output can still be reported as a fact.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

MAX_DEPTH = 64
_REPLACEMENT = "\ufffd"


class RequestTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"
    default_detail = "the request body is too large"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _clean_text(text: str) -> str:
    if "\x00" in text:
        text = text.replace("\x00", _REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from "\ud800"-style escapes
        text = "".join(_REPLACEMENT if 0xD800 <= ord(char) <= 0xDFFF else char for char in text)
    return text


def make_storable(data: Any) -> Any:
    """Check depth and numbers, and clean every string (keys too), without recursion."""
    root: list[Any] = [data]
    stack: list[tuple[Any, Any, Any, int]] = [(root, 0, data, 1)]
    while stack:
        parent, key, value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ParseError(f"JSON nesting is deeper than {MAX_DEPTH} levels")
        if isinstance(value, str):
            parent[key] = _clean_text(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ParseError("numbers must be finite")
        elif isinstance(value, dict):
            cleaned = {_clean_text(k): v for k, v in value.items()}
            parent[key] = cleaned
            stack.extend((cleaned, k, v, depth + 1) for k, v in cleaned.items())
        elif isinstance(value, list):
            stack.extend((value, index, item, depth + 1) for index, item in enumerate(value))
    return root[0]


class SafeJSONParser(JSONParser):
    def parse(
        self,
        stream: Any,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = parser_context.get("request")
        declared = _declared_length(request)
        if limit is not None and declared is not None and declared > limit:
            raise RequestTooLarge(f"the request body is {declared} bytes; the limit is {limit}")
        raw = stream.read(limit + 1) if limit is not None else stream.read()
        if limit is not None and len(raw) > limit:
            raise RequestTooLarge(f"the request body is over the limit of {limit} bytes")
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError):
            raise ParseError(f"the request body is not valid {encoding}") from None
        try:
            data = json.loads(text, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {str(exc)[:200]}") from None
        return make_storable(data)


def _declared_length(request: Any) -> int | None:
    meta = getattr(request, "META", None) or {}
    try:
        return int(meta.get("CONTENT_LENGTH") or meta.get("HTTP_CONTENT_LENGTH") or 0) or None
    except (TypeError, ValueError):
        return None
