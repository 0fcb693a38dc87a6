"""A team's policies are evaluated as one CEL program (`policies.engine.Together`), and each
policy still answers for itself (DESIGN §14): when one expression fails, CEL makes the whole
program an error, and the others are evaluated again to decide; the failing one applies its
own `on_error`. Counted in evaluations, not timed."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from policies import engine
from policies.engine import Compiled, Moment, PolicySet, check
from policies.language import compile_expression
from policies.models import Policy, PolicyHit
from runs.errors import RunNotRunning
from runs.models import Approval, ExecutionState, LedgerEntry, RunStatus, StopRequest
from tests.support.policies import permit, policy
from tests.support.scenarios import make_running, reload

QUIET = ("call.repeats >= 1000", "run.cost_usd > 1000.0", 'call.tool == "never"')
# At the parser's recursion limit alone (32 levels): the list of all adds one, so this policy
# cannot be compiled with the others.
DEEP = "(" * 31 + "call.repeats > 1000" + ")" * 31
# A compiled set is cached under its policies' (id, updated_at), as a save changes updated_at:
# each policy built here is a new save.
_SAVES = itertools.count()


def _compiled(index: int, expression: str) -> Compiled:
    return Compiled(
        id=index,
        updated_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=next(_SAVES)),
        name=f"p{index}",
        expression=expression,
        action="stop",
        mode="enforce",
        on_error="require_approval",
        agent_glob="*",
        tool_glob="*",
        program=compile_expression(expression),
    )


def _moment(**arguments: Any) -> Moment:
    return Moment(
        "tool.permit",
        tool="search",
        arguments=arguments,
        side_effect="write",
        repeats=2,
        is_call=True,
    )


def _check(policies: list[Compiled], moment: Moment) -> list[tuple[str, bool, bool]]:
    run = {"run.cost_usd": 2.5}
    results = check(
        PolicySet(tuple(policies)), agent=lambda: "bot", moment=moment, run_value=run.__getitem__
    )
    return [(result.policy.name, result.matched, bool(result.error)) for result in results]


def _alone(policies: list[Compiled], moment: Moment) -> list[tuple[str, bool, bool]]:
    return [found for policy in policies for found in _check([policy], moment)]


class _Counted:
    """Counts the evaluations of the CEL runtime: together (one program for many policies)
    and alone (one policy's own program)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.together = self.alone = 0
        together, alone = engine.evaluate_together, engine.evaluate

        def counted_together(*args: Any) -> Any:
            self.together += 1
            return together(*args)

        def counted_alone(*args: Any) -> Any:
            self.alone += 1
            return alone(*args)

        monkeypatch.setattr(engine, "evaluate_together", counted_together)
        monkeypatch.setattr(engine, "evaluate", counted_alone)


def test_fifty_policies_that_all_answer_are_one_evaluation(monkeypatch):
    policies = [_compiled(n, QUIET[n % len(QUIET)]) for n in range(50)]
    _check(policies, _moment(q="x"))  # compiles the set's program
    counted = _Counted(monkeypatch)
    assert _check(policies, _moment(q="x")) == []
    assert (counted.together, counted.alone) == (1, 0)


def test_one_failing_policy_leaves_the_others_to_answer_as_they_would_alone(monkeypatch):
    policies = [_compiled(n, QUIET[n % len(QUIET)]) for n in range(50)]
    policies[17] = _compiled(17, "call.arguments.amount > 100")
    policies[40] = _compiled(40, "call.repeats >= 2")
    moment = _moment(q="x")
    expected = [("p17", False, True), ("p40", True, False)]
    assert _alone(policies, moment) == expected
    counted = _Counted(monkeypatch)
    assert _check(policies, moment) == expected
    # Halves down to the failing policy (about two evaluations a level), not fifty alone.
    assert counted.together + counted.alone < 20
    # Given the argument, the same policy answers with the others, in one evaluation.
    counted.together = counted.alone = 0
    assert _check(policies, _moment(amount=500)) == [("p17", True, False), ("p40", True, False)]
    assert (counted.together, counted.alone) == (1, 0)


def test_a_policy_too_deep_to_join_the_others_is_evaluated_alone():
    policies = [_compiled(n, QUIET[n % len(QUIET)]) for n in range(10)]
    policies.append(_compiled(10, DEEP.replace("> 1000", ">= 2")))
    assert _check(policies, _moment(q="x")) == [("p10", True, False)]


@pytest.mark.django_db
def test_a_failing_policy_holds_the_call_while_the_others_still_decide(team):
    for index, expression in enumerate(QUIET * 3):
        policy(team, f"quiet-{index}", expression)
    broken = policy(team, "needs-amount", "call.arguments.amount > 100")
    policy(team, "searches", 'call.tool == "search"', action="notify")
    policy(team, "repeats", "call.repeats >= 2")
    run, _lease = make_running(team)

    held, _ = permit(run, "c1", side_effect="write", arguments={"to": "x"})
    # The failing policy applies its on_error (the default: hold the call) …
    assert held.execution_state == ExecutionState.AWAITING_APPROVAL
    assert Approval.objects.get(execution_record=held).rule_name == "needs-amount"
    # … and the one that matched beside it acted.
    assert LedgerEntry.objects.filter(run=run, action="policy.notified").count() == 1
    assert reload(run).status == RunStatus.RUNNING

    with pytest.raises(RunNotRunning):
        permit(run, "c2", side_effect="write", arguments={"to": "x"})
    assert StopRequest.objects.get(run=run).requested_by == "policy:repeats"

    broken.refresh_from_db()
    assert broken.errors_count == 2
    erred = set(Policy.objects.filter(team=team, errors_count__gt=0).values_list("name", flat=True))
    assert erred == {"needs-amount"}
    acted = set(PolicyHit.objects.filter(run=run).values_list("policy_name", "outcome"))
    assert acted == {
        ("needs-amount", "error"),
        ("needs-amount", "acted"),
        ("searches", "acted"),
        ("repeats", "acted"),
    }
