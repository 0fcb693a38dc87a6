"""Which of a team's policies match at one moment, with the values they saw (DESIGN §14).

Shared by enforcement (`policies.evaluate`) and the test against history
(`policies.history`): a moment is one fact changing (a permit asked, a result, an outbox
item, a batch's event, a tick); the context is built from only the names the team's policies
read, and the policies that apply are evaluated together, as one CEL program, against one
activation (`Together`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from typing import Any

from policies.language import (
    ExpressionError,
    Program,
    activation,
    compile_expression,
    compile_together,
    evaluate,
    evaluate_together,
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
    def key(self) -> tuple[int, datetime]:
        return (self.id, self.updated_at)

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

    all: PolicySet
    # An events batch has no call: the policies that read none, and of those the ones that
    # read `event.type` (only they can answer differently for each type in the batch).
    batch: PolicySet
    batch_typed: PolicySet
    # The periodic tick: the rules of time.
    time: PolicySet

    @classmethod
    def of(cls, policies: list[Compiled]) -> TeamPolicies:
        batch = tuple(policy for policy in policies if not policy.reads_call)
        return cls(
            all=PolicySet(tuple(policies)),
            batch=PolicySet(batch),
            batch_typed=PolicySet(tuple(policy for policy in batch if policy.reads_event_type)),
            time=PolicySet(
                tuple(policy for policy in policies if "run.elapsed_seconds" in policy.names)
            ),
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


class _Group:
    """Policies evaluated as one CEL program, a list of their booleans. When it cannot answer
    for all of them (one expression failed, and CEL makes the whole list an error; or the
    list does not compile: wrapping adds a level to the parser's recursion limit, the joined
    text may pass its size limit), its halves answer, down to the policy that failed, which is
    evaluated alone: its error and `on_error` are its own, and a policy that fails at every
    call costs the others a few more evaluations, not one each. Each level is compiled the
    first time it is needed."""

    def __init__(self, policies: tuple[Compiled, ...]) -> None:
        self.policies = policies

    @functools.cached_property
    def program(self) -> Any | None:
        return compile_together([policy.expression for policy in self.policies])

    @functools.cached_property
    def halves(self) -> tuple[_Group, _Group]:
        middle = len(self.policies) // 2
        return _Group(self.policies[:middle]), _Group(self.policies[middle:])

    def evaluate(self, bound: Any, matched: set[int], failed: dict[int, str]) -> None:
        if len(self.policies) == 1:
            policy = self.policies[0]
            assert policy.program is not None
            hit, error = evaluate(policy.program, bound)
            if error:
                failed[policy.id] = error
            elif hit:
                matched.add(policy.id)
            return
        program = self.program
        flags = None if program is None else evaluate_together(program, bound)
        if flags is None:
            for half in self.halves:
                half.evaluate(bound, matched, failed)
        elif any(flags):
            matched.update(p.id for p, hit in zip(self.policies, flags, strict=True) if hit)


@dataclass(frozen=True)
class Together:
    """The policies that apply at a moment, evaluated as one CEL program (`_Group`): 50
    evaluations cost about what one does, most of an evaluation being the crossing into the
    runtime and back, and a moment where nothing matches builds nothing per policy."""

    policies: tuple[Compiled, ...]
    group: _Group | None
    # The `run.*` names the policies read (each asked once per check).
    run_names: tuple[str, ...]
    # Some policy's stored expression no longer compiles: it is an error at every check.
    any_broken: bool

    @classmethod
    def of(cls, policies: tuple[Compiled, ...]) -> Together:
        names = {name for policy in policies for name in policy.names}
        evaluable = tuple(policy for policy in policies if policy.program is not None)
        return cls(
            policies=policies,
            group=_Group(evaluable) if evaluable else None,
            run_names=tuple(name for name in sorted(names) if name.startswith("run.")),
            any_broken=len(evaluable) < len(policies),
        )

    def results(self, bound: Any, data: dict[str, Any]) -> list[Result]:
        """Matches and errors, in the policies' order (the order acting follows)."""
        matched: set[int] = set()
        failed: dict[int, str] = {}
        if self.group is not None:
            self.group.evaluate(bound, matched, failed)
        if not matched and not failed and not self.any_broken:
            return []
        results = []
        for policy in self.policies:
            error = policy.compile_error if policy.program is None else failed.get(policy.id, "")
            if error or policy.id in matched:
                seen = {name: data[name] for name in policy.names}
                results.append(Result(policy, not error, error, seen))
        return results


# The applying policies' keys → those policies together. Compiled once per process for each
# set that applies (a team's whole set at a permit, the ones that read no call at a batch, …);
# an edit changes a key, so the next check compiles the new set.
_together: dict[tuple[tuple[int, datetime], ...], Together] = {}
_TOGETHER_MAX = 1_000


def _together_of(policies: tuple[Compiled, ...]) -> Together:
    key = tuple(policy.key for policy in policies)
    found = _together.get(key)
    if found is None:
        if len(_together) >= _TOGETHER_MAX:
            _together.clear()
        found = _together[key] = Together.of(policies)
    return found


class PolicySet:
    """Policies a kind of check evaluates (a team's all, a batch's, the tick's), with the
    programs of the policies that apply worked out once. Without an agent or tool glob, which
    policies apply depends only on whether the moment has a call, so a check does nothing per
    policy before the evaluation."""

    def __init__(self, policies: tuple[Compiled, ...]) -> None:
        self.policies = policies
        self.scoped = any(not (policy.any_agent and policy.any_tool) for policy in policies)

    def __bool__(self) -> bool:
        return bool(self.policies)

    def __iter__(self) -> Iterator[Compiled]:
        return iter(self.policies)

    @functools.cached_property
    def _at_a_call(self) -> Together:
        return _together_of(self.policies)

    @functools.cached_property
    def _away_from_a_call(self) -> Together | None:
        applying = tuple(policy for policy in self.policies if not policy.reads_call)
        return _together_of(applying) if applying else None

    def applying(self, agent: Callable[[], str], moment: Moment) -> Together | None:
        if not self.policies:
            return None
        if not self.scoped:
            return self._at_a_call if moment.tool else self._away_from_a_call
        applying = tuple(policy for policy in self.policies if policy.applies(agent, moment))
        return _together_of(applying) if applying else None


def check(
    policies: PolicySet,
    *,
    agent: Callable[[], str],
    moment: Moment,
    run_value: Callable[[str], Any],
) -> list[Result]:
    """Evaluate every policy that applies, against one activation; `run_value(name)` gives a
    `run.*` value (asked once per name, only for names some policy reads)."""
    together = policies.applying(agent, moment)
    if together is None:
        return []
    data = _call_values(moment)
    data.update((name, run_value(name)) for name in together.run_names)
    return together.results(activation(data), data)


def describe_values(values: dict[str, Any]) -> str:
    """The values a policy saw, for a stop note or an approval's reason."""
    return ", ".join(f"{name}={value!r}" for name, value in values.items()) or "nothing"
