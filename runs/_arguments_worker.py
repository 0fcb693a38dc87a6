"""Check a reviewer's edited arguments against an agent's JSON Schema, in a child process.

Run by `runs.argument_schemas._run_worker` as `python -I _arguments_worker.py`, with
`{"mode", "schema", "arguments", "memory_bytes", "cpu_seconds"}` as JSON on stdin (mode
`arguments`: check the arguments against the schema; `schema`: check a large schema against
the 2020-12 meta-schema); prints one line, `{"valid": true}` or
`{"valid": false, "where", "message"}`. It imports nothing of the project
(no Django, no database connection): the parent kills it when its time is up.

Inside it, jsonschema matches every pattern with RE2 (linear time), `uniqueItems` is linear
(canonical keys instead of jsonschema's pairwise comparison of unhashable items), and
references are resolved in the one document only (a registry whose `retrieve` refuses).
"""

from __future__ import annotations

import json
import resource
import sys
from typing import Any


def _limit(memory_bytes: int, cpu_seconds: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))


class _Re2Module:
    """What jsonschema asks of `re` (search), answered by RE2, with compiled patterns cached."""

    def __init__(self) -> None:
        import re2

        self._re2 = re2
        self._options = re2.Options()
        self._options.log_errors = False
        self._compiled: dict[str, Any] = {}

    def search(self, pattern: str, string: str) -> Any:
        compiled = self._compiled.get(pattern)
        if compiled is None:
            compiled = self._compiled[pattern] = self._re2.compile(pattern, self._options)
        return compiled.search(string)


def _canonical(value: Any) -> Any:
    """A hashable key equal for JSON-equal values: 1 == 1.0, true != 1, key order ignored."""
    if isinstance(value, bool) or value is None:
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, list):
        return ("a", tuple(_canonical(item) for item in value))
    if isinstance(value, dict):
        return ("o", tuple(sorted((key, _canonical(item)) for key, item in value.items())))
    return ("?", repr(value))


def _validator_class() -> Any:
    import jsonschema
    import jsonschema._keywords
    import jsonschema._utils
    from jsonschema.exceptions import ValidationError

    # jsonschema calls `re.search` from these two modules (pattern, patternProperties,
    # additionalProperties, unevaluatedProperties): in this process only, that is RE2.
    matcher = _Re2Module()
    jsonschema._keywords.re = matcher  # type: ignore[attr-defined]
    jsonschema._utils.re = matcher  # type: ignore[attr-defined]

    def unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Any:
        if not unique or not validator.is_type(instance, "array"):
            return
        keys = [_canonical(item) for item in instance]
        if len(set(keys)) != len(keys):
            yield ValidationError("the array has non-unique elements")

    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator, {"uniqueItems": unique_items}
    )


def _refuse(uri: str) -> Any:
    import referencing.exceptions

    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


def check(schema: Any, arguments: Any) -> dict[str, Any]:
    import referencing
    from jsonschema.exceptions import best_match

    validator = _validator_class()(schema, registry=referencing.Registry(retrieve=_refuse))  # type: ignore[call-arg]
    error = best_match(validator.iter_errors(arguments))
    if error is None:
        return {"valid": True}
    where = "/".join(str(part) for part in error.absolute_path) or "(root)"
    message = error.message if len(error.message) <= 500 else error.message[:500] + "…"
    return {"valid": False, "where": where[:300], "message": message}


def check_schema(schema: Any) -> dict[str, Any]:
    import jsonschema

    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as error:
        return {"valid": False, "where": "(root)", "message": error.message[:500]}
    return {"valid": True}


def main() -> int:
    request = json.loads(sys.stdin.buffer.read().decode("utf-8", "surrogatepass"))
    _limit(int(request["memory_bytes"]), int(request["cpu_seconds"]))
    sys.setrecursionlimit(4000)
    try:
        if request.get("mode") == "schema":
            verdict = check_schema(request["schema"])
        else:
            verdict = check(request["schema"], request["arguments"])
    except RecursionError:
        verdict = {
            "valid": False,
            "where": "(root)",
            "message": "the schema's references nest too deeply to check",
        }
    print(json.dumps(verdict))
    return 0


if __name__ == "__main__":
    sys.exit(main())
