"""Agent-supplied JSON Schemas for a reviewer's edits, checked without trusting them.

An agent may send an `arguments_schema` with an approval request; a reviewer's edited
arguments must match it. The schema is the agent's text, so checking it is untrusted work:

1. **At the permit** (`arguments_schema_check`, in process, before any lock): the schema is
   bounded in size and depth, valid against the 2020-12 meta-schema, one document (no `$id`,
   no other dialect's `$schema`), and every `$ref` / `$dynamicRef` is a local fragment that
   resolves — through a `referencing` registry whose `retrieve` refuses, so no schema ever
   causes a network request. Chains of references applied to the same value (`{"$ref": "#"}`,
   `a -> b -> a`, through `allOf` and friends) would recurse forever at the decision, so they
   are refused here. Every `pattern` and `patternProperties` key must compile under RE2.
2. **At the decision** (`edited_arguments_check`, before the run is locked): the edited
   arguments are bounded in size and depth, then validated in a child process
   (`runs/_arguments_worker.py`) that uses RE2 (linear time: no catastrophic backtracking) for
   every pattern, a linear `uniqueItems`, a memory limit, and is killed when it runs past
   SAFESTOP_ARGUMENTS_CHECK_SECONDS. Holding the run lock during this check would make a stop
   wait behind a reviewer's validation; a child process also keeps a long check off the
   server's GIL, so other requests are not slowed by it.

An approval's schema is written once with the approval and never changed, so checking the
edits against it before the lock is the same as checking them under it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import re2
import referencing
import referencing.exceptions
import referencing.jsonschema
from django.conf import settings

from runs.errors import InvalidInput

# The nesting the API's parser accepts (api.parsers.MAX_DEPTH): deeper JSON is refused
# everywhere, so json, jsonschema and psycopg never recurse past Python's limit.
MAX_JSON_DEPTH = 64
DIALECT = "https://json-schema.org/draft/2020-12/schema"
_BASE_URI = "urn:safestop:arguments-schema"
_WORKER = Path(__file__).with_name("_arguments_worker.py")
# A schema with more subschemas than this is checked against the meta-schema in the child
# process (bounded time), a smaller one here (a few milliseconds).
IN_PROCESS_SUBSCHEMAS = 64

# Keywords whose value is one schema, a list of schemas, or a map of name -> schema (2020-12).
_ONE = (
    "additionalProperties",
    "propertyNames",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Applied to the same value, not to a part of it: a cycle through these never ends.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")


class SchemaRefused(InvalidInput):
    """An `arguments_schema` that cannot be checked safely; `code` says why."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"arguments_schema: {detail}", field="arguments_schema")
        self.code = code


class ArgumentsRefused(InvalidInput):
    """Edited arguments that cannot be (or were not) checked against the schema."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail, field="arguments")
        self.code = code


# --------------------------------------------------------------------------------------------
# JSON bounds (iterative: a value too deep for recursion must still be measurable)


def json_too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return False


def json_size(value: Any) -> int:
    """Bytes of the compact UTF-8 JSON form (call only on values within MAX_JSON_DEPTH)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode("utf-8", "surrogatepass"))


# --------------------------------------------------------------------------------------------
# the permit: the schema itself


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    # Called for any reference outside the one document: never fetched, always unresolvable.
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


REFUSING_REGISTRY: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


def _subschemas(schema: dict[str, Any]) -> list[Any]:
    found: list[Any] = []
    for keyword in _ONE:
        if keyword in schema:
            found.append(schema[keyword])
    for keyword in _MANY:
        value = schema.get(keyword)
        if isinstance(value, list):
            found.extend(value)
    for keyword in _MAP:
        value = schema.get(keyword)
        if isinstance(value, dict):
            found.extend(value.values())
    return found


def _in_place(schema: dict[str, Any]) -> list[Any]:
    found = [schema[keyword] for keyword in _IN_PLACE_ONE if keyword in schema]
    for keyword in _IN_PLACE_MANY:
        value = schema.get(keyword)
        if isinstance(value, list):
            found.extend(value)
    dependent = schema.get("dependentSchemas")
    if isinstance(dependent, dict):
        found.extend(dependent.values())
    return found


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the agent's answer, not a server log line
    return options


_RE2_OPTIONS = _re2_options()


def _re2_refusal(pattern: str) -> str | None:
    try:
        re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as error:
        why = error.args[0] if error.args else error
        return why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
    return None


def _check_one(node: dict[str, Any]) -> None:
    if "$id" in node:
        raise SchemaRefused(
            "schema_unsupported",
            "$id is not supported: an arguments schema is one document (use $defs and local "
            "references)",
        )
    dialect = node.get("$schema")
    if dialect is not None and str(dialect).rstrip("#") != DIALECT:
        raise SchemaRefused(
            "schema_unsupported",
            f"only JSON Schema 2020-12 is supported ($schema {str(dialect)[:100]!r})",
        )
    patterns: list[Any] = []
    if "pattern" in node:
        patterns.append(node["pattern"])
    if isinstance(node.get("patternProperties"), dict):
        patterns.extend(node["patternProperties"])
    for pattern in patterns:
        if isinstance(pattern, str) and (why := _re2_refusal(pattern)):
            raise SchemaRefused(
                "schema_unsupported_pattern",
                f"pattern {pattern[:100]!r} is not supported ({why}); patterns are matched "
                "by RE2: no backreferences or look-around",
            )


def _walk(
    start: Any,
    *,
    resolver: referencing._core.Resolver[Any],
    edges: dict[int, list[int]],
    seen: dict[int, dict[str, Any]],
) -> None:
    """Visit every subschema reachable from the root `start` (through references too): check
    it, and record its in-place edges (id -> ids) for the loop check."""
    stack = [start]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen[id(node)] = node
        _check_one(node)
        targets: list[Any] = list(_in_place(node))
        for keyword in ("$ref", "$dynamicRef"):
            if keyword not in node:
                continue
            ref = node[keyword]
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise SchemaRefused(
                    "schema_remote_ref",
                    f"{keyword} {str(ref)[:200]!r} is not local: only references inside the "
                    "schema ('#/$defs/name', '#anchor') are allowed; nothing is ever fetched",
                )
            try:
                resolved = resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                raise SchemaRefused(
                    "schema_bad_ref", f"{keyword} {ref[:200]!r} points to nothing in the schema"
                ) from None
            if not isinstance(resolved.contents, dict | bool):
                raise SchemaRefused(
                    "schema_bad_ref", f"{keyword} {ref[:200]!r} does not point to a schema"
                )
            targets.append(resolved.contents)
            if keyword == "$dynamicRef" and ref[1:] and "/" not in ref:
                # Resolved at run time against the dynamic scope: any subschema declaring
                # that anchor may be the target, so every one counts as an edge.
                targets.extend(_dynamic_anchors(start, ref[1:]))
        edges[id(node)] = [id(target) for target in targets if isinstance(target, dict)]
        stack.extend(_subschemas(node))
        stack.extend(target for target in targets if isinstance(target, dict))


def _dynamic_anchors(root: Any, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("$dynamicAnchor") == name:
                found.append(node)
            stack.extend(_subschemas(node))
    return found


def _find_loop(edges: dict[int, list[int]]) -> bool:
    """A cycle in the in-place graph (iterative three-colour depth-first search)."""
    state: dict[int, int] = {}  # 1: on the path, 2: done
    for start in edges:
        if state.get(start):
            continue
        path = [(start, iter(edges.get(start, ())))]
        state[start] = 1
        while path:
            node, children = path[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                path.pop()
            elif state.get(child) == 1:
                return True
            elif not state.get(child):
                state[child] = 1
                path.append((child, iter(edges.get(child, ()))))
    return False


def arguments_schema_check(schema: Any, *, max_bytes: int | None = None) -> dict[str, Any] | None:
    """An agent's JSON Schema for edits, refused (400, a `schema_*` code) unless it can be
    checked safely later. None or {} means "no schema". `max_bytes`: default
    SAFESTOP_ARGUMENTS_SCHEMA_MAX_BYTES."""
    if schema is None or schema == {}:
        return None
    if not isinstance(schema, dict):
        raise SchemaRefused("schema_invalid", "must be a JSON Schema object")
    limit = settings.SAFESTOP_ARGUMENTS_SCHEMA_MAX_BYTES if max_bytes is None else max_bytes
    if json_too_deep(schema):
        raise SchemaRefused("schema_too_large", f"nested deeper than {MAX_JSON_DEPTH} levels")
    if (size := json_size(schema)) > limit:
        raise SchemaRefused("schema_too_large", f"{size} bytes; the limit is {limit}")
    _check_one(schema)
    resource = referencing.jsonschema.DRAFT202012.create_resource(schema)
    registry = REFUSING_REGISTRY.with_resource(_BASE_URI, resource)
    resolver = registry.resolver(base_uri=_BASE_URI)
    edges: dict[int, list[int]] = {}
    seen: dict[int, dict[str, Any]] = {}
    _walk(schema, resolver=resolver, edges=edges, seen=seen)
    if _find_loop(edges):
        raise SchemaRefused(
            "schema_ref_loop",
            "references loop back to the same value ($ref/$dynamicRef, directly or through "
            "allOf/anyOf/oneOf/not/if/then/else) and would never finish",
        )
    if len(seen) <= IN_PROCESS_SUBSCHEMAS:
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as error:
            why: str | None = error.message
        else:
            why = None
    else:
        why = _meta_schema_check_in_child(schema)
    if why is not None:
        raise SchemaRefused("schema_invalid", f"not a valid JSON Schema: {why[:300]}")
    return schema


def _meta_schema_check_in_child(schema: dict[str, Any]) -> str | None:
    """jsonschema's meta-schema check costs about 20 ms per subschema on a busy core: a large
    schema is checked in a child process, with the decision's time and memory limits."""
    seconds = settings.SAFESTOP_ARGUMENTS_CHECK_SECONDS
    try:
        verdict = _run_worker({"mode": "schema", "schema": schema})
    except subprocess.TimeoutExpired:
        raise SchemaRefused(
            "schema_too_large", f"checking it took longer than {seconds} s and was stopped"
        ) from None
    if verdict is None:
        raise SchemaRefused("schema_invalid", "it could not be checked (the check failed)")
    return None if verdict.get("valid") else str(verdict.get("message"))


# --------------------------------------------------------------------------------------------
# the decision: a reviewer's edited arguments


def edited_arguments_check(schema: dict[str, Any] | None, arguments: Any) -> None:
    """Refuse edited arguments that are too big or too deep, or that do not match `schema`.

    Never call this under the run lock or in a transaction: it may take up to
    SAFESTOP_ARGUMENTS_CHECK_SECONDS (it waits for a child process).
    """
    if not isinstance(arguments, dict):
        raise InvalidInput("arguments must be a JSON object", field="arguments")
    if json_too_deep(arguments):
        raise ArgumentsRefused(
            "arguments_too_deep", f"the arguments are nested deeper than {MAX_JSON_DEPTH} levels"
        )
    limit = settings.SAFESTOP_ARGUMENTS_MAX_BYTES
    if (size := json_size(arguments)) > limit:
        raise ArgumentsRefused(
            "arguments_too_large", f"the arguments are {size} bytes; the limit is {limit}"
        )
    if not schema:
        return
    seconds = settings.SAFESTOP_ARGUMENTS_CHECK_SECONDS
    try:
        verdict = _run_worker({"mode": "arguments", "schema": schema, "arguments": arguments})
    except subprocess.TimeoutExpired:
        raise ArgumentsRefused(
            "arguments_check_timeout",
            f"checking the arguments against the agent's schema took longer than {seconds} s "
            "and was stopped; approve the original arguments, or reject",
        ) from None
    if verdict is None:
        raise ArgumentsRefused(
            "arguments_check_failed",
            "the arguments could not be checked against the agent's schema (the check failed "
            "or ran out of memory); approve the original arguments, or reject",
        )
    if not verdict.get("valid"):
        raise InvalidInput(
            f"edited arguments do not match the schema at {verdict.get('where') or '(root)'}: "
            f"{str(verdict.get('message'))[:500]}",
            field="arguments",
        )


def _run_worker(request: dict[str, Any]) -> dict[str, Any] | None:
    """The child's verdict, or None when it failed; TimeoutExpired once it was killed."""
    seconds = settings.SAFESTOP_ARGUMENTS_CHECK_SECONDS
    body = json.dumps(
        {
            **request,
            "memory_bytes": settings.SAFESTOP_ARGUMENTS_CHECK_MEMORY_BYTES,
            "cpu_seconds": max(1, int(seconds) + 1),
        },
        ensure_ascii=False,
    ).encode("utf-8", "surrogatepass")
    # -I: isolated (no PYTHON* variables, no current directory on the path). run() kills the
    # child when the time is up, then raises TimeoutExpired.
    done = subprocess.run(
        [sys.executable, "-I", str(_WORKER)],
        input=body,
        capture_output=True,
        timeout=seconds,
        check=False,
    )
    try:
        verdict = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return verdict if done.returncode == 0 and isinstance(verdict, dict) else None
