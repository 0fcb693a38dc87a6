"""What checking costs (DESIGN §14), counted in SQL statements, not timed:
50 policies cost a permit and an events batch the statements no policy costs, because a
team's compiled set is cached per process under a version that every change replaces; and a
team that never had a policy keeps no facts, one statement less in each permit and result."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from policies.models import PolicyHit, PolicySetVersion, RunFacts
from policies.services import policy_delete, policy_update
from runs.errors import RunNotRunning
from runs.models import RunStatus, Team
from tests.support.policies import ADMIN, batch, permit, policy, result
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db

# Of the six templates' shapes, at thresholds no run here reaches.
SHAPES = (
    "run.tool_failures_in_a_row >= {n}",
    "call.repeats >= {n}",
    'call.side_effect == "write" && !(call.destination_host in ["", "api{n}.example.org"])',
    "run.cost_usd > {n}.0",
    "run.elapsed_seconds > {n}000.0",
    "run.side_effects_last_minute > {n}",
)


def _fifty(team: Team) -> None:
    for index in range(50):
        policy(team, f"p{index}", SHAPES[index % len(SHAPES)].format(n=1000 + index))


def _statements(call) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        call()
    return [query["sql"] for query in captured.captured_queries]


def _reads_policies(statements: list[str]) -> int:
    return sum('FROM "policies_policy"' in sql for sql in statements)


def _events(tag: str) -> list[dict]:
    return [
        {"event_id": f"{tag}-s", "type": "step.started", "key": tag},
        {"event_id": f"{tag}-c", "type": "step.completed", "key": tag},
        {
            "event_id": f"{tag}-u",
            "type": "usage",
            "model": "m",
            "input_tokens": 1,
            "output_tokens": 1,
        },
    ]


def _policies_all_deleted(team: Team) -> None:
    """A team with no policy left, whose set has a version (it had one)."""
    policy_delete(policy_id=policy(team, "gone", "call.repeats >= 1000").pk, actor=ADMIN)
    assert PolicySetVersion.objects.filter(team_id=team.pk).exists()


def test_a_permit_with_50_policies_costs_the_statements_of_one_with_none(team, other_team):
    _fifty(team)
    _policies_all_deleted(other_team)
    run, _ = make_running(team)
    bare, _ = make_running(other_team)
    permit(run, "warm")  # this process compiles the team's set once
    permit(bare, "warm")
    with_policies = _statements(lambda: permit(run, "c1", arguments={"q": 1}))
    without = _statements(lambda: permit(bare, "c1", arguments={"q": 1}))
    assert len(with_policies) == len(without)
    assert _reads_policies(with_policies) == 0
    assert reload(run).status == RunStatus.RUNNING


def test_an_events_batch_with_50_policies_costs_the_statements_of_one_with_none(team, other_team):
    _fifty(team)
    _policies_all_deleted(other_team)
    run, _ = make_running(team)
    bare, _ = make_running(other_team)
    batch(run, *_events("warm"))
    batch(bare, *_events("warm"))
    with_policies = _statements(lambda: batch(run, *_events("b1")))
    without = _statements(lambda: batch(bare, *_events("b1")))
    # The one more is the policies' read after the writes, which a team none of whose
    # policies looks at batches does without (its opening reads the set's version).
    assert len(with_policies) == len(without) + 1
    assert _reads_policies(with_policies) == 0


def test_a_team_that_never_had_a_policy_writes_no_facts(team, other_team):
    _policies_all_deleted(other_team)
    never, _ = make_running(team)
    had, _ = make_running(other_team)
    for run in (never, had):
        permit(run, "warm")
        result(run, "warm", "succeeded")
    permits = [_statements(lambda r=r: permit(r, "c1", arguments={"q": 1})) for r in (never, had)]
    results = [_statements(lambda r=r: result(r, "c1", "failed")) for r in (never, had)]
    facts_upserts = [
        sum('INSERT INTO "policies_runfacts"' in sql for sql in statements)
        for statements in (*permits, *results)
    ]
    assert facts_upserts == [0, 1, 0, 1]
    assert len(permits[0]) == len(permits[1]) - 1
    assert len(results[0]) == len(results[1]) - 1
    assert not RunFacts.objects.filter(run=never).exists()
    assert RunFacts.objects.get(run=had).tool_failures_in_a_row == 1


def test_facts_start_with_the_teams_first_policy(team):
    run, _ = make_running(team)
    for index in range(3):  # the same call three times before any policy: not counted
        permit(run, f"before{index}")
    policy(team, "loop", "call.repeats >= 3")
    permit(run, "after0")
    permit(run, "after1")
    assert reload(run).status == RunStatus.RUNNING
    assert RunFacts.objects.get(run=run).repeats == 2
    with pytest.raises(RunNotRunning):
        permit(run, "after2")
    assert reload(run).stop_reason == "policy_violation"


def test_every_change_to_a_teams_policies_writes_a_new_version(team):
    def version() -> int | None:
        return (
            PolicySetVersion.objects.filter(team_id=team.pk)
            .values_list("version", flat=True)
            .first()
        )

    seen = [version()]
    loop = policy(team, "loop", "call.repeats >= 3")
    seen.append(version())
    policy_update(policy_id=loop.pk, actor=ADMIN, enabled=False)
    seen.append(version())
    policy_update(policy_id=loop.pk, actor=ADMIN, enabled=True)
    seen.append(version())
    policy_delete(policy_id=loop.pk, actor=ADMIN)
    seen.append(version())
    assert seen[0] is None
    assert len(set(seen)) == len(seen)


def test_a_cached_set_is_read_again_once_after_a_change_and_the_change_applies(team):
    """The version is read in the check's own transaction, so a change committed before it,
    by this process or any other, is seen by that very check."""
    loop = policy(team, "loop", "call.repeats >= 2")
    run, _ = make_running(team)
    permit(run, "c1", arguments={"q": "a"})
    assert _reads_policies(_statements(lambda: permit(run, "c2", arguments={"q": "b"}))) == 0

    policy_update(policy_id=loop.pk, actor=ADMIN, enabled=False)
    first = _statements(lambda: permit(run, "c3", arguments={"q": "b"}))
    assert _reads_policies(first) == 1  # disabled: not stopped, and the set re-read once
    assert _reads_policies(_statements(lambda: permit(run, "c4", arguments={"q": "c"}))) == 0
    assert reload(run).status == RunStatus.RUNNING

    policy_update(policy_id=loop.pk, actor=ADMIN, enabled=True)
    with pytest.raises(RunNotRunning):
        permit(run, "c5", arguments={"q": "c"})
    assert reload(run).stop_reason == "policy_violation"


def test_a_deleted_policy_stops_acting_at_the_next_check(team):
    loop = policy(team, "loop", "call.repeats >= 2")
    run, _ = make_running(team)
    permit(run, "c1")
    policy_delete(policy_id=loop.pk, actor=ADMIN)
    permit(run, "c2")
    assert reload(run).status == RunStatus.RUNNING


def test_a_batch_evaluates_a_policy_reading_the_event_type_at_each_type(team):
    """A policy that does not read `event.type` is evaluated at a batch's first type only (it
    sees the same values at every type); one that reads it, at each."""
    policy(team, "any", "run.tokens > 0", action="notify")
    policy(team, "usage", 'event.type == "usage" && run.tokens > 0', action="notify")
    run, _ = make_running(team)
    batch(run, *_events("b1"))
    hits = dict(PolicyHit.objects.filter(run=run).values_list("policy_name", "event_type"))
    assert hits == {"any": "step.started", "usage": "usage"}


def test_an_erroring_policy_counts_one_error_per_batch_not_per_type(team):
    untyped = policy(team, "untyped", "int(run.cost_usd) / 0 > 1", on_error="ignore")
    typed = policy(
        team,
        "typed",
        'event.type != "usage" && int(run.cost_usd) / 0 > 1',
        on_error="ignore",
    )
    run, _ = make_running(team)
    batch(run, *_events("b1"))  # three types: step.started, step.completed, usage
    untyped.refresh_from_db()
    typed.refresh_from_db()
    assert (untyped.errors_count, typed.errors_count) == (1, 2)
    assert reload(run).status == RunStatus.RUNNING
