"""Agent-supplied schemas and the approval page's diff: what the bounded versions cost.

No database, no server: the pure functions the services and the page call.

    .venv/bin/python bench/bench_schema_limits.py

1. the diff of N edited keys (`console.views.approvals.arguments_diff`) against difflib.ndiff,
   which it replaced (ndiff scores every pair of replaced lines: it is timed at 100 and 200
   keys only);
2. one edited-arguments check in the child process (`edited_arguments_check`), for a ReDoS
   trap (34 characters of `^(a+)+$`: RE2 answers at once; Python's `re` is timed at 22 and 24
   characters, each two more doubling it) and for `uniqueItems` over 3,000 objects (against
   jsonschema in process, which compares them pairwise);
3. the permit's schema check (`arguments_schema_check`) on a schema near the 32 KiB limit.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

import django  # noqa: E402

django.setup()

import jsonschema  # noqa: E402

from console.views.approvals import _pretty, arguments_diff  # noqa: E402
from runs.argument_schemas import arguments_schema_check, edited_arguments_check  # noqa: E402
from runs.errors import InvalidInput  # noqa: E402


def timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def row(name: str, seconds: float, note: str = "") -> None:
    print(f"{name:<62} {seconds * 1000:>10.1f} ms  {note}")


def diffs() -> None:
    for keys in (100, 200, 2000):
        before = {f"key_{n:05}": n for n in range(keys)}
        after = {f"key_{n:05}": n + 1 for n in range(keys)}
        row(
            f"arguments_diff, {keys} edited keys",
            timed(lambda b=before, a=after: arguments_diff(b, a)),
        )
        if keys <= 200:
            a, b = _pretty(before).splitlines(), _pretty(after).splitlines()
            old = timed(lambda a=a, b=b: list(difflib.ndiff(a, b)))
            row(f"difflib.ndiff (before), {keys} edited keys", old)


def checks() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}}}
    for length in (22, 24):
        trap = "a" * (length - 1) + "!"
        row(
            f"Python re, ReDoS trap of {length} characters (before)",
            timed(lambda trap=trap: re.search("^(a+)+$", trap)),
        )

    def refused(arguments: dict[str, Any], schema: dict[str, Any]) -> None:
        try:
            edited_arguments_check(schema, arguments)
        except InvalidInput:
            pass

    row(
        "edited_arguments_check, ReDoS trap of 34 characters (RE2)",
        timed(lambda: refused({"name": "a" * 33 + "!"}, schema)),
        "(one child process)",
    )
    rows = [{"id": n, "tags": ["a", "b"], "meta": {"n": n}} for n in range(3000)]
    unique = {"type": "object", "properties": {"rows": {"type": "array", "uniqueItems": True}}}
    row(
        "jsonschema in process, uniqueItems over 3,000 objects (before)",
        timed(lambda: list(jsonschema.Draft202012Validator(unique).iter_errors({"rows": rows}))),
    )
    row(
        "edited_arguments_check, uniqueItems over 3,000 objects",
        timed(lambda: refused({"rows": rows}, unique)),
        "(one child process)",
    )
    row("edited_arguments_check, a trivial schema", timed(lambda: refused({}, {"type": "object"})))


def permit() -> None:
    schema = {
        "type": "object",
        "$defs": {f"d{n}": {"type": "string", "pattern": f"^x{n}[a-z]+$"} for n in range(400)},
        "properties": {f"p{n}": {"$ref": f"#/$defs/d{n}"} for n in range(400)},
    }
    row(
        "arguments_schema_check, a 31 KiB schema with 400 refs",
        timed(lambda: arguments_schema_check(schema)),
    )


if __name__ == "__main__":
    diffs()
    checks()
    permit()
