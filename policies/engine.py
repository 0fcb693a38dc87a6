"""Which of a team's policies match at one moment, with the values they saw (DESIGN §14).

Shared by enforcement (`policies.evaluate`) and the test against history
(`policies.history`): a moment is one fact changing (a permit asked, a result, an outbox
item, a batch's event, a tick); the context is built from only the names the team's policies
read, and every policy is evaluated against one activation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from policies.language import (
    ExpressionError,
    Program,
    activation,
    compile_expression,
    evaluate,
)
from policies.models import Policy

# The columns a cached policy is keyed and built from.
POLICY_FIELDS = (
    "id",
    "updated_at",
    "name",
    "expression",
    "action",
    "mode",
    "on_error",
    "agent_glob",
    "tool_glob",
)


@dataclass(frozen=True)
class Compiled:
    id: int
    updated_at: datetime
    name: str
    expression: str
    action: str
    mode: str
    on_error: str
    agent_glob: str
    tool_glob: str
    program: Program | None
    # A stored expression that no longer compiles fails closed like an evaluation error.
    compile_error: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return self.program.names if self.program else ()

    @functools.cached_property
    def reads_call(self) -> bool:
        return any(name.startswith("call.") for name in self.names)

    @functools.cached_property
    def reads_event_type(self) -> bool:
        return "event.type" in self.names

    @functools.cached_property
    def any_agent(self) -> bool:
        return self.agent_glob in ("", "*")

    @functools.cached_property
    def any_tool(self) -> bool:
        return self.tool_glob in ("", "*")

    def applies(self, agent: Callable[[], str], moment: Moment) -> bool:
        """In scope at this moment. A policy that reads `call.*` is checked only where there
        is a call (a permit, an outbox item, a tool's result): elsewhere its values are
        blanks, and `!(call.destination_host in [...])` would match every step."""
        if self.reads_call and not moment.tool:
            return False
        if not self.any_tool and not (moment.is_call and fnmatchcase(moment.tool, self.tool_glob)):
            return False
        return self.any_agent or fnmatchcase(agent(), self.agent_glob)


# (id, updated_at) → compiled: an edit changes updated_at, so the next evaluation compiles the
# new expression; the old entry is dropped when the cache is pruned.
_cache: dict[tuple[int, datetime], Compiled] = {}
_CACHE_MAX = 10_000


def compiled(row: tuple[Any, ...]) -> Compiled:
    key = (row[0], row[1])
    found = _cache.get(key)
    if found is not None:
        return found
    values = dict(zip(POLICY_FIELDS, row, strict=True))
    try:
        program, error = compile_expression(values["expression"]), ""
    except ExpressionError as refused:
        program, error = None, f"the expression no longer compiles: {refused}"
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    found = _cache[key] = Compiled(program=program, compile_error=error, **values)
    return found


@dataclass(frozen=True)
class TeamPolicies:
    """A team's enabled policies, compiled, and the subsets each kind of check evaluates."""

    all: tuple[Compiled, ...]
    # An events batch has no call: the policies that read none, and of those the ones that
    # read `event.type` (only they can answer differently for each type in the batch).
    batch: tuple[Compiled, ...]
    batch_typed: tuple[Compiled, ...]
    # The periodic tick: the rules of time.
    time: tuple[Compiled, ...]

    @classmethod
    def of(cls, policies: list[Compiled]) -> TeamPolicies:
        batch = tuple(policy for policy in policies if not policy.reads_call)
        return cls(
            all=tuple(policies),
            batch=batch,
            batch_typed=tuple(policy for policy in batch if policy.reads_event_type),
            time=tuple(policy for policy in policies if "run.elapsed_seconds" in policy.names),
        )


# team id → (the version of its policy set it was compiled at, the set). The version is read
# in the transaction of every check (`policies.reads`), and every change to a team's policies
# writes a new one in its own transaction (`policies.reads.policies_changed`): a change
# committed in any process is seen by the next check in every process.
_teams: dict[int, tuple[int, TeamPolicies]] = {}
_TEAMS_MAX = 10_000


def team_policies(team_id: int, version: int) -> TeamPolicies:
    """The team's enabled policies, compiled: from this process's cache while `version` is the
    one they were read at, else one indexed query (compiling only the policies that changed).

    The rows are read after the version, in the same transaction, so the cache never holds a
    set older than the version it is filed under (at worst a newer one, re-read next time)."""
    found = _teams.get(team_id)
    if found is not None and found[0] == version:
        return found[1]
    rows = Policy.objects.filter(team_id=team_id, enabled=True).values_list(*POLICY_FIELDS)
    policies = TeamPolicies.of([compiled(row) for row in rows])
    if len(_teams) >= _TEAMS_MAX:
        _teams.clear()
    _teams[team_id] = (version, policies)
    return policies


def compile_policy(policy: Policy) -> Compiled:
    return compiled(tuple(getattr(policy, name) for name in POLICY_FIELDS))


@dataclass(frozen=True)
class Moment:
    """One fact changing: the event's type and, for a call or an outbox item, the call."""

    event_type: str
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    side_effect: str = "none"
    destination_host: str = ""
    repeats: int = 0
    is_call: bool = False

    @property
    def is_side_effect(self) -> bool:
        return self.is_call and self.side_effect == "write"


@dataclass(frozen=True)
class Result:
    policy: Compiled
    matched: bool
    error: str
    values: dict[str, Any]


def _call_values(moment: Moment) -> dict[str, Any]:
    return {
        "call.tool": moment.tool,
        "call.arguments": moment.arguments,
        "call.side_effect": moment.side_effect,
        "call.destination_host": moment.destination_host,
        "call.repeats": moment.repeats,
        "event.type": moment.event_type,
    }


def check(
    policies: Iterable[Compiled],
    *,
    agent: Callable[[], str],
    moment: Moment,
    run_value: Callable[[str], Any],
) -> list[Result]:
    """Evaluate every policy that applies; `run_value(name)` gives a `run.*` value (asked once
    per name, only for names some policy reads)."""
    applying = [policy for policy in policies if policy.applies(agent, moment)]
    if not applying:
        return []
    names = {name for policy in applying for name in policy.names}
    data = _call_values(moment)
    data.update((name, run_value(name)) for name in names if name.startswith("run."))
    bound = activation(data)
    results = []
    for policy in applying:
        if policy.program is None:
            matched, error = False, policy.compile_error
        else:
            matched, error = evaluate(policy.program, bound)
        if matched or error:
            seen = {name: data[name] for name in policy.names}
            results.append(Result(policy, matched, error, seen))
    return results


def describe_values(values: dict[str, Any]) -> str:
    """The values a policy saw, for a stop note or an approval's reason."""
    return ", ".join(f"{name}={value!r}" for name, value in values.items()) or "nothing"
