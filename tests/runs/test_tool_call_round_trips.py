"""A tool call's permit and its result each wait for two round trips to PostgreSQL: the opening
(BEGIN, the run lock, what the transition decides on and the team policies' row, one pipeline)
and the writes (the record with the run's counters and the ledger entry) with the COMMIT in a
second one, when nothing is written after them. The MCP gateway asks both for every
`tools/call` (docs/BENCHMARKS.md). Counted on the wire (libpq's protocol trace), never timed;
each test also checks what the statements must still do.
"""

from __future__ import annotations

import pytest

from policies.models import RunFacts
from policies.reads import read_for_checks_statement
from runs import sql
from runs.ledger import ledger_verify
from runs.models import Approval, ExecutionRecord, LedgerEntry, RunStatus
from tests.support.policies import permit, policy, result
from tests.support.round_trips import RoundTrips
from tests.support.scenarios import make_running, reload

# Real transactions: in a test's own transaction the service's would be a savepoint, and the
# COMMIT would not happen.
pytestmark = pytest.mark.django_db(transaction=True)

# The two pipelines, the COMMIT in the second.
ROUND_TRIPS = 2


def _counted(monkeypatch: pytest.MonkeyPatch, call) -> RoundTrips:
    with RoundTrips().counting(monkeypatch) as trips:
        call()
    return trips


def test_a_permit_and_a_result_wait_for_three_round_trips_each(team, monkeypatch):
    policy(team, "loop", "call.repeats >= 50")  # the team's checks read and write facts
    run, _ = make_running(team)
    permit(run, "warm")
    result(run, "warm", "succeeded")

    asked = _counted(monkeypatch, lambda: permit(run, "c1", arguments={"q": 1}))
    answered = _counted(monkeypatch, lambda: result(run, "c1", "failed"))

    policies_read, _ = read_for_checks_statement(run.pk)
    # The permit's policies write their facts before its own writes, which carry the COMMIT;
    # the result's write them after its own, so its COMMIT is a round trip of its own.
    assert (asked.pipelines, asked.commits, asked.waits) == (2, 0, ROUND_TRIPS + 1)
    assert (answered.pipelines, answered.commits, answered.waits) == (2, 1, ROUND_TRIPS + 2)
    for trips in (asked, answered):
        # The facts' upsert is the one statement of its own (a team with policies only).
        assert [s for s in trips.alone if "policies_runfacts" not in s] == [], trips.alone
        assert trips.count == trips.waits
        assert policies_read in trips.in_pipelines
        assert sum(s.startswith('INSERT INTO "runs_ledgerentry"') for s in trips.in_pipelines) == 1
    record = ExecutionRecord.objects.get(run=run, tool_call_id="c1")
    assert record.execution_state == "failed"
    assert reload(run).tool_calls_count == 2
    assert RunFacts.objects.get(run=run).tool_failures_in_a_row == 1
    actions = list(
        LedgerEntry.objects.filter(run=run).order_by("run_seq").values_list("action", flat=True)
    )
    assert actions[-4:] == ["tool.permitted", "tool.result", "tool.permitted", "tool.result"]
    assert ledger_verify(run_id=run.pk)[1] is None


def test_a_team_without_policies_waits_for_two_round_trips(team, monkeypatch):
    run, _ = make_running(team)
    permit(run, "warm")
    asked = _counted(monkeypatch, lambda: permit(run, "c1"))
    answered = _counted(monkeypatch, lambda: result(run, "c1", "succeeded"))
    for trips in (asked, answered):
        # On the wire: BEGIN went with the opening's statements, COMMIT with the writes.
        assert (trips.count, trips.waits, trips.commits) == (ROUND_TRIPS, ROUND_TRIPS, 0)
        assert trips.alone == []
        assert trips.in_pipelines[-1] == "COMMIT"
    record = ExecutionRecord.objects.get(run=run, tool_call_id="c1")
    assert record.execution_state == "succeeded"
    assert ledger_verify(run_id=run.pk)[1] is None


def test_a_held_call_commits_after_its_approval_is_written(team, monkeypatch):
    run, _ = make_running(team)
    asked = _counted(monkeypatch, lambda: permit(run, "c1", needs_approval=True))
    assert asked.commits == 1
    assert "COMMIT" not in asked.in_pipelines
    record = ExecutionRecord.objects.get(run=run, tool_call_id="c1")
    assert record.execution_state == "awaiting_approval"
    assert Approval.objects.get(execution_record=record).status == "waiting"


def test_a_policy_sees_the_results_facts_read_with_the_opening(team):
    # The policies' row is read before the result's own writes, in the same pipeline as the
    # lock: nothing the result writes is in it, so three failures in a row still stop the run.
    policy(team, "failures", "run.tool_failures_in_a_row >= 3", action="stop")
    run, _ = make_running(team)
    for index in range(3):
        permit(run, f"c{index}")
        result(run, f"c{index}", "failed")
    assert reload(run).status != RunStatus.RUNNING
    assert reload(run).stop_reason == "policy_violation"


@pytest.mark.parametrize("prepared", [True, False], ids=["postgresql", "orm-as-on-sqlite"])
def test_both_paths_write_the_same_permit_and_result(team, monkeypatch, prepared):
    # SQLite (`make run`) takes the ORM path: the same rows and ledger, a statement each.
    monkeypatch.setattr(sql, "prepared_statements", lambda: prepared)
    run, _ = make_running(team)
    permit(run, "c1", side_effect="write")
    result(run, "c1", "unknown")
    record = ExecutionRecord.objects.get(run=run, tool_call_id="c1")
    assert (record.execution_state, record.side_effect_state) == (
        "unknown",
        "pending_verification",
    )
    assert reload(run).tool_calls_count == 1
    assert ledger_verify(run_id=run.pk)[1] is None
    assert list(
        LedgerEntry.objects.filter(run=run, action__startswith="tool.").values_list(
            "action", "payload__tool_call_id"
        )
    ) == [("tool.permitted", "c1"), ("tool.result", "c1")]
