"""The policy language: CEL (Common Expression Language) through `cel-expr-python`, Google's
CEL C++ runtime behind a Python binding (DESIGN §14).

Why this binding: it type-checks at compile time (an unknown name or a comparison of a number
with text is refused when a policy is saved, with line and column), and it evaluates a
compiled program in microseconds. Its wheels install on our platforms (Linux x86-64 and arm64,
CPython 3.12+), so the fallback `common-expression-language` (a Rust interpreter with no
type checker) is not needed.

The context is declared as dotted variables (`run.steps`, `call.tool`, `event.type`): the
checker resolves `run.steps` to the variable of that name, so `run.stepz` is an undeclared
reference at its column, not a field looked up at run time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cel_expr_python import cel
from django.utils.translation import gettext_lazy as _

_T = cel.Type

# Name → (CEL type, what it means). The order is the order the docs and the console list them.
CONTEXT: dict[str, tuple[Any, Any]] = {
    "run.agent": (_T.STRING, _("the run's agent")),
    "run.team": (_T.STRING, _("the run's team (its slug)")),
    "run.elapsed_seconds": (_T.DOUBLE, _("seconds since the run started")),
    "run.steps": (_T.INT, _("steps the run has started")),
    "run.tool_calls": (_T.INT, _("tool calls asked for so far")),
    "run.tool_failures_in_a_row": (
        _T.INT,
        _("tool results that failed in a row (0 after a success)"),
    ),
    "run.side_effects_last_minute": (
        _T.INT,
        _("side effects (write calls and outbox items) asked for in the last 60 seconds"),
    ),
    "run.cost_usd": (_T.DOUBLE, _("what the run's model calls cost so far, in USD")),
    "run.tokens": (_T.INT, _("model tokens so far (input + output)")),
    "call.tool": (_T.STRING, _("the tool asked for (blank when the event is not a call)")),
    "call.arguments": (_T.Map(_T.STRING, _T.DYN), _("the call's arguments (an outbox payload)")),
    "call.side_effect": (_T.STRING, _("'write' or 'none' ('write' for an outbox item)")),
    "call.destination_host": (
        _T.STRING,
        _(
            "the host the call reaches: an outbox item's destination host, or the host of the "
            "call's `url` argument; blank otherwise"
        ),
    ),
    "call.repeats": (
        _T.INT,
        _(
            "how many times in a row this tool was asked with the same canonical arguments (1 for "
            "a new call, 0 when the event is not a call)"
        ),
    ),
    "event.type": (
        _T.STRING,
        _(
            "tool.permit, outbox.enqueue, tool.result, step.started, step.completed, step.failed, "
            "usage, … (the events batch's types), or tick"
        ),
    ),
}

MAX_EXPRESSION_CHARS = 4000

_ENV = cel.NewEnv(variables={name: kind for name, (kind, _doc) in CONTEXT.items()})
# "ERROR: <input>:3:4: undeclared reference to 'nope' (in container '')"
_ERROR_AT = re.compile(r"ERROR: <input>:(\d+):(\d+): ([^\n]*)")
_NAME = re.compile(r"\b(run|call|event)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class ExpressionError(Exception):
    """An expression the checker refused: the first error, where it is (1-based)."""

    message: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        where = f"line {self.line}, column {self.column}: " if self.line else ""
        return where + self.message


@dataclass(frozen=True)
class Program:
    """A compiled, type-checked expression and the context names it reads."""

    program: Any
    names: tuple[str, ...]


def compile_expression(text: str) -> Program:
    """Parse and type-check `text` against the context; it must be a boolean."""
    if not text.strip():
        raise ExpressionError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"at most {MAX_EXPRESSION_CHARS} characters")
    try:
        program = _ENV.compile(text)
    except RuntimeError as error:
        raise _located(str(error)) from None
    returns = program.return_type()
    if returns != _T.BOOL:
        raise ExpressionError(
            f"the expression must be a boolean (true or false), not {returns.name().lower()}",
            1,
            1,
        )
    return Program(program, referenced_names(text))


def _located(detail: str) -> ExpressionError:
    found = _ERROR_AT.search(detail)
    if found is None:
        return ExpressionError(detail.removeprefix("INVALID_ARGUMENT: ").strip()[:300])
    message = found.group(3).replace(" (in container '')", "")
    # CEL's line and column both count from 1, as people do.
    return ExpressionError(message, int(found.group(1)), int(found.group(2)))


def referenced_names(text: str) -> tuple[str, ...]:
    """The context names an expression mentions, in context order (the values a hit shows)."""
    mentioned = {f"{root}.{field}" for root, field in _NAME.findall(text)}
    return tuple(name for name in CONTEXT if name in mentioned)


def activation(data: dict[str, Any]) -> Any:
    """One activation for every policy evaluated at the same moment."""
    return _ENV.Activation(data)


def compile_together(texts: list[str]) -> Any | None:
    """Several policies' expressions as one program, a CEL list of their booleans, or None
    when the list does not compile (the parser's recursion limit, 32, counts the list as a
    level; the joined text may pass CEL's size limit). One per line: an expression that ends
    in a `//` comment does not swallow the next."""
    try:
        return _ENV.compile("[\n" + ",\n".join(texts) + "\n]")
    except RuntimeError:
        return None


def evaluate_together(program: Any, bound: Any) -> list[bool] | None:
    """Each expression's boolean, in order, or None when any of them failed: CEL makes the
    whole list an error then, and the caller evaluates them one by one to learn which."""
    try:
        result = program.eval(bound)
    except RuntimeError:
        return None
    if result.type() == _T.ERROR:
        return None
    flags = result.plain_value()
    return flags if isinstance(flags, list) else None


def evaluate(program: Program, bound: Any) -> tuple[bool, str]:
    """(matched, error): an evaluation error (a missing map key, an overflow) is an error, never
    a match or a miss; the caller applies the policy's `on_error`."""
    try:
        result = program.program.eval(bound)
    except RuntimeError as error:  # the runtime raises for some failures, returns others
        return False, str(error)[:500]
    if result.type() == _T.BOOL:
        return bool(result.value()), ""
    return False, str(result.value())[:500]
