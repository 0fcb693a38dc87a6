"""A single event's statements and round trips to PostgreSQL stay few (docs/BENCHMARKS.md).

An agent sends one event per step all day; each is BEGIN + the run lock + the receipts and
steps it names in one pipeline, then its writes and the team policies' read in a second one,
then COMMIT. A change that adds a round trip (a read of its own, a statement outside the
pipelines) fails the count here; each test also checks what the statements must still do.
Counted, never timed.
"""

from __future__ import annotations

from typing import Any

import pytest

from policies.reads import read_for_checks_statement
from runs.actors import Actor
from runs.models import EventReceipt, RunStatus, Step, StopReason, StopRequest
from runs.services import events as event_services
from tests.support.policies import policy
from tests.support.round_trips import RoundTrips
from tests.support.scenarios import make_running, reload

# Real transactions: in a test's own transaction the batch's would be a savepoint, and the
# COMMIT (a round trip of its own) would not happen.
pytestmark = pytest.mark.django_db(transaction=True)

# The run lock (with the token re-check), the receipts, the named steps | the step's write, the
# receipt, the run's change sequence, the policies' read.
SINGLE_EVENT_STATEMENTS = 7
SINGLE_EVENT_PIPELINES = 2
# The two pipelines and the COMMIT (BEGIN goes in the first pipeline).
SINGLE_EVENT_ROUND_TRIPS = 3


def _ingest(run: Any, token: Any, events: list[dict[str, Any]]) -> list[str]:
    answers = event_services.events_ingest(
        run_id=run.pk,
        epoch=run.stop_epoch,
        events=events,
        actor=Actor.for_token(token),
        token_check=event_services.TokenCheck(
            token_id=token.pk, team_id=token.team_id, role=token.role
        ),
    )
    return [answer.status for answer in answers]


@pytest.fixture
def warm(team: Any, agent_token: Any) -> tuple[Any, Any]:
    """A running run that has had one event: the team's compiled policies are cached."""
    run, _lease = make_running(team)
    token = agent_token.token
    assert _ingest(run, token, [{"event_id": "w", "type": "step.started", "key": "warm"}]) == [
        "accepted"
    ]
    return reload(run), token


def test_a_single_event_is_two_pipelines(warm, monkeypatch):
    run, token = warm
    with RoundTrips().counting(monkeypatch) as trips:
        statuses = _ingest(run, token, [{"event_id": "c", "type": "step.completed", "key": "warm"}])
    assert statuses == ["accepted"]
    assert trips.alone == []
    assert (trips.pipelines, len(trips.in_pipelines), trips.count) == (
        SINGLE_EVENT_PIPELINES,
        SINGLE_EVENT_STATEMENTS,
        SINGLE_EVENT_ROUND_TRIPS,
    )
    # ... and the statements did their work
    assert Step.objects.get(run=run, key="warm").status == "completed"
    assert EventReceipt.objects.get(run=run, event_id="c").outcome == "accepted"
    assert reload(run).change_seq == run.change_seq + 1


def test_a_new_step_is_two_pipelines_too(warm, monkeypatch):
    run, token = warm
    with RoundTrips().counting(monkeypatch) as trips:
        statuses = _ingest(run, token, [{"event_id": "s", "type": "step.started", "key": "next"}])
    assert statuses == ["accepted"]
    assert (trips.count, len(trips.in_pipelines)) == (
        SINGLE_EVENT_ROUND_TRIPS,
        SINGLE_EVENT_STATEMENTS,
    )
    step = Step.objects.get(run=run, key="next")
    assert (step.status, step.seq) == ("running", Step.objects.get(run=run, key="warm").seq + 1)


def test_a_duplicate_writes_nothing_and_reads_no_policies(warm, monkeypatch):
    run, token = warm
    with RoundTrips().counting(monkeypatch) as trips:
        statuses = _ingest(run, token, [{"event_id": "w", "type": "step.started", "key": "warm"}])
    assert statuses == ["duplicate"]
    # the opening pipeline and the COMMIT
    assert (trips.count, len(trips.in_pipelines)) == (2, 3)


def test_the_policies_read_in_the_pipeline_sees_the_batchs_writes(warm, monkeypatch):
    """The read goes after the writes: the spend this very event reports stops the run."""
    run, token = warm
    policy(run.team, "spend", "run.cost_usd > 1.0")
    usage = {"type": "usage", "model": "x", "input_tokens": 1, "output_tokens": 1}
    assert _ingest(run, token, [{"event_id": "u1", **usage, "cost_usd": 0.75}]) == ["accepted"]
    assert reload(run).status == RunStatus.RUNNING
    with RoundTrips().counting(monkeypatch) as trips:
        statuses = _ingest(reload(run), token, [{"event_id": "u2", **usage, "cost_usd": 0.5}])
    assert statuses == ["accepted"]
    assert reload(run).status != RunStatus.RUNNING
    assert StopRequest.objects.get(run=run).reason == StopReason.POLICY_VIOLATION
    # The policies' read is in the second pipeline, not a round trip of its own.
    read, _params = read_for_checks_statement(run.pk)
    assert read in trips.in_pipelines
    assert read not in trips.alone
