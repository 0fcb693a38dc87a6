"""Schemathesis hooks for the live schema fuzz (tests/api/test_schema_live.py), loaded by the
`schemathesis` CLI through SCHEMATHESIS_HOOKS.

A generated run id never exists, so without help every call under /runs/{run_id}/ would stop at
the 404 and nothing behind it would be fuzzed. The test seeds real runs, an approval and tool
calls and names them in SAFESTOP_FUZZ_IDS (JSON: path parameter name → ids); this hook points
most generated path parameters at one of them. The choice is a hash of the generated value, so
a seeded (derandomized) run makes the same calls every time, and a generated value is still
kept now and then, so the 404 answers are exercised too.
"""

from __future__ import annotations

import json
import os
import zlib
from datetime import datetime
from typing import Any

import schemathesis

from runs.argument_schemas import SchemaRefused, arguments_schema_check

KEEP_GENERATED_ONE_IN = 4


def _seeded_ids() -> dict[str, list[Any]]:
    return json.loads(os.environ.get("SAFESTOP_FUZZ_IDS", "{}"))


def pick(name: str, generated: Any, seeded: dict[str, list[Any]]) -> Any:
    """A seeded id for `name` most of the time, chosen by the generated value's hash."""
    choices = seeded.get(name) or []
    if not choices:
        return generated
    slot = zlib.crc32(repr((name, generated)).encode("utf-8", "surrogatepass"))
    if slot % KEEP_GENERATED_ONE_IN == 0:
        return generated
    return choices[(slot // KEEP_GENERATED_ONE_IN) % len(choices)]


@schemathesis.hook
def map_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
    if not isinstance(path_parameters, dict):
        return path_parameters  # an operation without path parameters
    seeded = _seeded_ids()
    return {name: pick(name, value, seeded) for name, value in path_parameters.items()}


# Rules across fields, or on configuration, that JSON Schema cannot state; each is in the
# operation's description, and the API answers 400 for it. A *positive* case that breaks one
# is not a schema-valid request the API wrongly refuses, so it is left out (or mended) here.
# Negative cases are never touched.


def _positive(case: Any) -> bool:
    meta = getattr(case, "meta", None)
    return meta is not None and meta.generation.mode.is_positive


def _period_is_empty(query: Any) -> bool:
    """`since` must be before `until` (stop-quality, denials, ledger)."""
    if not isinstance(query, dict) or not query.get("since") or not query.get("until"):
        return False
    try:
        since = datetime.fromisoformat(str(query["since"]).replace("Z", "+00:00"))
        until = datetime.fromisoformat(str(query["until"]).replace("Z", "+00:00"))
        return since >= until
    except (TypeError, ValueError):
        return False


BULK_FILTERS = ("agent", "team", "status", "tool", "ids")


def _bulk_names_no_run(body: Any) -> bool:
    """A bulk stop names at least one filter or `all: true` (an empty filter stops nothing by
    accident: DESIGN §12)."""
    body = body if isinstance(body, dict) else {}  # no body: no filter either
    return body.get("all") is not True and not any(body.get(name) for name in BULK_FILTERS)


def _rejection_with_arguments(body: Any) -> bool:
    """A rejection carries a message, never edited arguments."""
    return (
        isinstance(body, dict)
        and body.get("decision") == "reject"
        and body.get("arguments") is not None
    )


def _invalid_arguments_schema(body: Any) -> bool:
    """`arguments_schema` must be a JSON Schema (Draft 2020-12) that can be checked safely:
    bounded, local references only, no reference loop, RE2 patterns."""
    schema = body.get("arguments_schema") if isinstance(body, dict) else None
    if not isinstance(schema, dict):
        return False
    try:
        # the server's default limit: the hooks run in schemathesis' process, without Django
        arguments_schema_check(schema, max_bytes=32 * 1024)
    except SchemaRefused:
        return True
    return False


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    if not _positive(case):
        return True
    path = case.operation.path
    if path.endswith(("/stop-quality/", "/denials/", "/ledger/")) and _period_is_empty(case.query):
        return False
    if path.endswith("/decide/") and _rejection_with_arguments(case.body):
        return False
    if path.endswith(("/permits/", "/outbox/")) and _invalid_arguments_schema(case.body):
        return False
    return not (path == "/api/v1/runs/stop/" and _bulk_names_no_run(case.body))


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    """Data the schema cannot know, put into positive cases the way the path ids are: an outbox
    destination must be a URL on SAFESTOP_WEBHOOK_ALLOWED_HOSTS (the test sets hooks.example)
    or one email address; a bulk stop's `team` must be one of the caller's (SAFESTOP_FUZZ_TEAM);
    a resume's `checkpoint` must be one the run saved.
    The rest of the body is tested as generated."""
    body = case.body
    if not _positive(case) or not isinstance(body, dict):
        return case
    path = case.operation.path
    if path == "/api/v1/runs/stop/" and body.get("team"):
        body["team"] = os.environ.get("SAFESTOP_FUZZ_TEAM", "")
    if path.endswith("/resume/") and body.get("checkpoint"):
        body["checkpoint"] = ""  # a checkpoint must be one the run saved; blank: where it stopped
    if path.endswith("/outbox/") and body.get("transport") in ("webhook", "email"):
        tag = zlib.crc32(repr(body.get("destination")).encode("utf-8", "surrogatepass"))
        body["destination"] = (
            f"https://hooks.example/in/{tag}"
            if body["transport"] == "webhook"
            else f"ops+{tag}@customer.example"
        )
    return case
