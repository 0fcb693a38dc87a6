"""Hostile input is a 4xx with a message, never a 5xx: a 500 tells
the caller nothing about what to fix and pages whoever is on call.

Every URL pattern the project has when the test runs (walked from the resolver, so a view added
tomorrow is covered without editing this file; the admin's own pages excepted), driven with:

- each path parameter replaced by hostile values (NUL, surrogates, huge numbers, overlong text,
  traversal), the other parameters real;
- each query parameter the view reads (recorded while it answers a plain GET) set to hostile
  values: impossible and extreme dates, cursors, huge and negative numbers, NUL, surrogates;
- each form field a console POST reads, and each JSON field an API operation documents (its
  OpenAPI request body), set to hostile values of every JSON type, on top of a valid body so
  the value reaches the service and not only the serializer;
- other methods, other content types, broken bodies and broken credentials.

Any answer of 500 or more fails the test, listed with the request that caused it. Under
`/api/` every answer must also be JSON with an `error` code (an agent parses every answer).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from django.core.signals import got_request_exception
from django.http import QueryDict
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.converters import IntConverter, PathConverter
from drf_spectacular.generators import SchemaGenerator

from runs import services
from runs.models import Run
from tests.support.scenarios import running, stopped_dirty

# transaction=True: a request that fails in the database must not poison the next ones.
pytestmark = pytest.mark.django_db(transaction=True)

# Strings a path segment, a query parameter or a form field may carry.
HOSTILE_TEXT = [
    "\x00",
    "a\udfffb",
    "9" * 40,
    "-1",
    "1e309",
    "0001-01-01",
    "9999-12-31",
    "0001-01-01T00:00:00-23:59",
    "9999-12-31T23:59:59+23:59",
    "2024-02-30T25:61",
    "x" * 5_000,
    "../../../../etc/passwd",
    "%",
    " ",
]
# Values matching `<int:...>`: only digits get there.
HOSTILE_INTS = ["0", "9" * 30, "18446744073709551616", "9223372036854775808", "000000000001"]
# Every JSON type, at its extremes.
HOSTILE_JSON: list[Any] = [
    "https://hooks.example.com:99999/x",  # URLs urlsplit().port refuses
    "https://[::1/x",
    "https://hooks.example.com:8443x/",
    "\x00",
    "\ud800",
    "9999-12-31T23:59:59+23:59",
    "0001-01-01T00:00:00Z",
    "x" * 100_000,
    "",
    None,
    True,
    -1,
    2**63,
    10**30,
    1e308,
    [],
    {},
    [None],
    {"\x00": "\ud800"},
]
# Query parameters many views read; a view's own are added by recording what it reads.
COMMON_PARAMS = ["cursor", "limit", "offset", "page", "since", "until", "after", "before", "all"]
# Query-string cursors need their own: valid base64 around impossible content.
HOSTILE_CURSORS = [
    "MjAyNC0wMi0zMFQwMDowMDowMHxydW5feA",  # 2024-02-30T00:00:00|run_x
    "OTk5OS0xMi0zMVQyMzo1OTo1OXxydW5feA",  # 9999-12-31T23:59:59|run_x
    "MDAwMS0wMS0wMVQwMDowMDowMHwA",  # 0001-01-01T00:00:00|\x00
    "cD0tMQ",  # p=-1
    "bz05OTk5OTk5OTk5OTk5OTk5OTk5OTk5",  # o=99999999999999999999
    "!!!",
]


@dataclass
class Target:
    route: str  # the pattern, as text
    pattern: Any  # the joined RoutePattern / RegexPattern pieces
    params: dict[str, Any]  # name -> converter
    name: str


@dataclass
class Finding:
    route: str
    method: str
    path: str
    status: int
    detail: str


@dataclass
class Fuzzer:
    clients: dict[str, Client]
    findings: list[Finding] = field(default_factory=list)
    sent: int = 0
    errors: list[str] = field(default_factory=list)

    route: str = ""  # the pattern being fuzzed, for the report

    def send(
        self,
        who: str,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        data: Any = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        client = self.clients[who]
        full = path + ("?" + _encode(query) if query else "")
        kwargs: dict[str, Any] = dict(headers or {})
        if content_type is not None:
            kwargs["content_type"] = content_type
        self.errors.clear()
        call = getattr(client, method.lower())
        response = call(full, data, **kwargs) if data is not None else call(full, **kwargs)
        self.sent += 1
        status = response.status_code
        detail = self.errors[0] if self.errors else ""
        if status >= 500:
            self.findings.append(Finding(self.route, method, repr(full), status, detail))
        elif (
            path.startswith("/api/v1/") and method != "HEAD" and not _is_json_error_or_ok(response)
        ):
            content_type = response.get("Content-Type", "")
            self.findings.append(
                Finding(self.route, method, repr(full), status, f"not JSON: {content_type}")
            )
        return response


def _encode(pairs: dict[str, Any] | list[tuple[str, str]]) -> str:
    """A query string or form body; values may hold lone surrogates (sent as their UTF-8 bytes)."""
    items = pairs.items() if isinstance(pairs, dict) else pairs
    return "&".join(
        f"{quote(name)}={quote(str(value).encode('utf-8', 'surrogatepass'), safe='')}"
        for name, value in items
    )


def _is_json_error_or_ok(response: Any) -> bool:
    if not response.get("Content-Type", "").startswith("application/json"):
        return False
    if response.status_code < 400:
        return True
    try:
        return "error" in json.loads(response.content)
    except ValueError:
        return False


@contextmanager
def _recording_reads() -> Iterator[set[str]]:
    """Record every key a view reads from a QueryDict (request.GET / request.POST)."""
    keys: set[str] = set()
    originals = {
        name: getattr(QueryDict, name) for name in ("get", "__getitem__", "getlist", "__contains__")
    }

    def wrap(name: str) -> Callable[..., Any]:
        original = originals[name]

        def recorder(self: QueryDict, key: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(key, str):
                keys.add(key)
            return original(self, key, *args, **kwargs)

        return recorder

    for name in originals:
        setattr(QueryDict, name, wrap(name))
    try:
        yield keys
    finally:
        for name, original in originals.items():
            setattr(QueryDict, name, original)


def _targets() -> list[Target]:
    out: list[Target] = []

    def walk(patterns: list[Any], prefix: str, converters: dict[str, Any]) -> None:
        for entry in patterns:
            text = prefix + str(entry.pattern)
            joined = {**converters, **getattr(entry.pattern, "converters", {})}
            if isinstance(entry, URLResolver):
                if text.startswith("admin/"):
                    continue  # Django's admin: not ours
                walk(entry.url_patterns, text, joined)
            elif isinstance(entry, URLPattern):
                out.append(Target(text, entry.pattern, joined, entry.name or ""))

    walk(get_resolver().url_patterns, "", {})
    return out


def _path(target: Target, values: dict[str, str]) -> str | None:
    """The path of a `path()` route with these raw parameter values; None for a regex route."""
    route = target.route
    if "^" in route or "(?P" in route:
        return None
    for name, converter in target.params.items():
        placeholder = f"<{_converter_name(converter)}:{name}>"
        safe = "/" if isinstance(converter, PathConverter) else ""
        encoded = quote(values[name].encode("utf-8", "surrogatepass"), safe=safe)
        route = route.replace(placeholder, encoded)
    return "/" + route


def _converter_name(converter: Any) -> str:
    from django.urls.converters import get_converters

    for name, registered in get_converters().items():
        if type(registered) is type(converter):
            return name
    raise AssertionError(f"unknown converter {converter!r}")


def _documented_bodies() -> dict[tuple[str, str], list[str]]:
    """(path template, method) -> the top-level JSON fields its OpenAPI request body has."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema.get("components", {}).get("schemas", {})
    out: dict[tuple[str, str], list[str]] = {}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if not body:
                continue
            ref = body["schema"].get("$ref", "")
            properties = components.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})
            out[(path, method.upper())] = list(properties)
    return out


def _openapi_path(target: Target) -> str:
    route = "/" + target.route
    for name, converter in target.params.items():
        route = route.replace(f"<{_converter_name(converter)}:{name}>", "{" + name + "}")
    return route


@pytest.fixture
def fuzz_settings(settings: Any) -> None:
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 0  # thousands of requests from one token
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com", "hooks.example.com:8443"]


def _world(team: Any, bob: Any) -> dict[str, Any]:
    """Objects for the path parameters that are not being fuzzed, fresh for every pattern."""
    from runs.actors import Actor

    live, lease = running(team)
    dirty = stopped_dirty(team, by=Actor.for_user(bob))
    message = services.steering_queue(run_id=live.pk, text="hi", actor=Actor.for_user(bob))
    return {
        "live": live,
        "lease": lease,
        "dirty": dirty,
        "values": {
            "run_id": live.pk,
            "epoch": str(dirty.stop_epoch),
            "message_id": str(message.pk),
            "item_id": str(dirty.outbox_items.values_list("pk", flat=True).first() or 1),
            "tool_call_id": live.execution_records.values_list("tool_call_id", flat=True).first()
            or "call_1",
            "decision": "release",
            "action": "close",
            "handoff_id": "1",
            "token_id": "999999",  # never one of the clients' own
            "rule_id": "1",
            "approval_id": "appr_1",
        },
    }


def _api_base_body(name: str, world: dict[str, Any]) -> dict[str, Any]:
    """A body that passes validation, so a hostile field reaches the service."""
    live: Run = world["live"]
    lease = world["lease"]
    lease_ref = {"lease_id": lease.token, "epoch": lease.epoch}
    return {
        "runs": {"title": "t", "agent": "a"},
        "lease": {"worker_id": "w"},
        "lease-heartbeat": lease_ref,
        "lease-release": lease_ref,
        "drained": lease_ref,
        "permits": {
            "epoch": live.stop_epoch,
            "tool_call_id": "fuzz_call",
            "tool": "t",
            "side_effect": "write",
            "arguments": {},
        },
        "tool-result": {"execution_state": "succeeded"},
        "events": {
            "epoch": live.stop_epoch,
            "events": [{"event_id": "fuzz_e", "type": "step.started", "key": "k"}],
        },
        "outbox": {
            "epoch": live.stop_epoch,
            "transport": "webhook",
            "destination": "https://hooks.example.com/x",
            "payload": {},
            "idempotency_key": "fuzz_k",
        },
        "cancel": {"reason": "user_stop"},
        "resolutions": {"target": "tool_call", "id": "x", "decision": "applied", "evidence": "x"},
        "steering": {"text": "hi"},
        "approval-decide": {"decision": "reject"},
        "approval-rules": {"name": "fuzz_rule", "tool_glob": "t*"},
    }.get(name, {})


@pytest.mark.timeout(1800)
def test_no_hostile_input_answers_5xx(
    fuzz_settings: None, team: Any, alice: Any, bob: Any, agent_token: Any, reviewer_token: Any
) -> None:
    def session(user: Any) -> Client:
        client = Client(raise_request_exception=False)
        client.force_login(user)
        return client

    def token(raw: str) -> Client:
        return Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {raw}")

    fuzzer = Fuzzer(
        clients={
            "admin": session(alice),
            "agent": token(agent_token.raw),
            "reviewer": token(reviewer_token.raw),
            "anonymous": Client(raise_request_exception=False),
        }
    )

    def on_error(sender: Any, request: Any = None, **kwargs: Any) -> None:
        import sys

        kind, value, _tb = sys.exc_info()
        fuzzer.errors.append(f"{kind.__name__ if kind else '?'}: {str(value)[:200]}")

    got_request_exception.connect(on_error)
    try:
        _fuzz(fuzzer, team, alice, bob)
    finally:
        got_request_exception.disconnect(on_error)

    # One line per (route, method, cause), with a count and one example.
    grouped: dict[tuple[str, str, int, str], list[Finding]] = {}
    for finding in fuzzer.findings:
        key = (finding.route, finding.method, finding.status, finding.detail[:120])
        grouped.setdefault(key, []).append(finding)
    report = "\n".join(
        f"{status} {method} {route} x{len(found)} e.g. {found[0].path[:160]}: {detail}"
        for (route, method, status, detail), found in sorted(grouped.items())
    )
    assert not fuzzer.findings, (
        f"{len(fuzzer.findings)} of {fuzzer.sent} hostile requests answered 5xx "
        f"(or non-JSON under /api/):\n{report}"
    )
    assert fuzzer.sent > 2000  # the walk really reached every pattern


def _fuzz(fuzzer: Fuzzer, team: Any, admin: Any, bob: Any) -> None:
    bodies = _documented_bodies()
    targets = _targets()
    assert any(t.route.startswith("api/v1/runs/") for t in targets)
    assert any(t.route.startswith("runs/") for t in targets)
    for target in targets:
        fuzzer.route = target.route
        fuzzer.clients["admin"].force_login(admin)  # the logout/ pattern logs it out
        world = _world(team, bob)
        values: dict[str, str] = {name: world["values"].get(name, "1") for name in target.params}
        path = _path(target, values)
        if path is None:  # the catch-all under /api/v1/: a few shapes of unknown path
            for unknown in ["/api/v1/nope", "/api/v1/runs", "/api/v1/\x00", "/api/v2/runs/"]:
                for method in ("GET", "POST", "DELETE"):
                    fuzzer.send("agent", method, quote(unknown))
            continue
        api = target.route.startswith("api/")
        who = "reviewer" if api else "admin"
        # 1. path parameters
        for name, converter in target.params.items():
            hostile = HOSTILE_INTS if isinstance(converter, IntConverter) else HOSTILE_TEXT
            for value in hostile:
                if not value.strip() and not isinstance(converter, PathConverter):
                    continue  # an empty segment does not match the pattern
                bad = _path(target, {**values, name: value})
                assert bad is not None
                fuzzer.send(who, "GET", bad)
                fuzzer.send(who, "POST", bad, data={})
        # 2. query parameters: the ones the view reads, and the usual ones
        with _recording_reads() as read:
            fuzzer.send(who, "GET", path)
        # The walk spends most of its time here (every value, every name, every page), so each
        # value goes alone only to the names the view reads; the usual names it did not read
        # (read only on some paths, e.g. with another parameter set) get it all at once.
        names = sorted(read | set(COMMON_PARAMS))
        for value in [*HOSTILE_TEXT, *HOSTILE_CURSORS]:
            # A cursor-shaped value is hostile only to a parameter that decodes cursors; to any
            # other it is one more string, which HOSTILE_TEXT already covers.
            cursor_only = value in HOSTILE_CURSORS
            for name in sorted(read):
                if cursor_only and "cursor" not in name:
                    continue
                fuzzer.send(who, "GET", path, query={name: value})
            # some only act together: a period needs both of its ends
            fuzzer.send(who, "GET", path, query=dict.fromkeys(names, value))
            if {"since", "until"} <= read:
                fuzzer.send(who, "GET", path, query={"since": value, "until": value})
        # 3. bodies: the API as an agent and as a reviewer (each may reach other code)
        if api:
            for caller in ("agent", "reviewer"):
                _fuzz_json(fuzzer, caller, target, path, _world(team, bob), bodies)
        else:
            _fuzz_form(fuzzer, who, path)
        # 4. other methods
        for method in ("PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"):
            fuzzer.send(who, method, path)
        # 5. no credentials and broken ones
        for header in ["Bearer \x00", "Bearer " + "x" * 5000, "Basic Zm9vOmJhcg==", "Bearer"]:
            fuzzer.send("anonymous", "GET", path, headers={"HTTP_AUTHORIZATION": header})
        fuzzer.send("anonymous", "POST", path, data={})


def _fuzz_json(
    fuzzer: Fuzzer,
    who: str,
    target: Target,
    path: str,
    world: dict[str, Any],
    bodies: dict[tuple[str, str], list[str]],
) -> None:
    base = _api_base_body(target.name, world)
    fields = bodies.get((_openapi_path(target), "POST"), [])
    for name in sorted(set(fields) | set(base)):
        for value in HOSTILE_JSON:
            body = {**base, name: value}
            if name == "idempotency_key" or name == "tool_call_id":
                body.setdefault("idempotency_key", "fuzz_k")
            fuzzer.send(who, "POST", path, data=json.dumps(body), content_type="application/json")
    for raw, content_type in [
        ("not json", "application/json"),
        ('{"a": 1', "application/json"),
        ("[1, 2]", "application/json"),
        ('"just a string"', "application/json"),
        ("a=1&b=2", "application/x-www-form-urlencoded"),
        ("\x00\xff", "text/plain"),
    ]:
        fuzzer.send(who, "POST", path, data=raw, content_type=content_type)
    fuzzer.send(
        who,
        "POST",
        path,
        data=json.dumps(base),
        content_type="application/json",
        headers={"CONTENT_TYPE": "application/json; charset=nonsense"},
    )


def _fuzz_form(fuzzer: Fuzzer, who: str, path: str) -> None:
    form = "application/x-www-form-urlencoded"
    with _recording_reads() as read:
        fuzzer.send(who, "POST", path, data="", content_type=form)
    for name in sorted(read - {"csrfmiddlewaretoken"}):
        for value in HOSTILE_TEXT:
            fuzzer.send(who, "POST", path, data=_encode({name: value}), content_type=form)
        # a list where one value goes
        fuzzer.send(who, "POST", path, data=_encode([(name, "a"), (name, "b")]), content_type=form)
