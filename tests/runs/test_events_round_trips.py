"""A single event's statements and round trips to PostgreSQL stay few (docs/BENCHMARKS.md).

An agent sends one event per step all day; each is BEGIN + the run lock + the receipts and
steps it names + the version of the team's policies in one pipeline, then its writes with the
COMMIT in a second one (the policies' read too, and the COMMIT on its own, when a policy of
the team looks at events). A change that adds a round trip (a read of its own, a statement
outside the pipelines, a fetch inside one) fails the count here: `waits` counts the round
trips on the wire. Each test also checks what the statements must still do. Counted, never
timed.
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
# COMMIT would not happen.
pytestmark = pytest.mark.django_db(transaction=True)

# The run lock (with the token re-check), the receipts, the named steps, the policies' version
# | the step's write, the receipt, the run's change sequence, COMMIT.
SINGLE_EVENT_STATEMENTS = 8
SINGLE_EVENT_PIPELINES = 2
# The two pipelines (BEGIN goes in the first, COMMIT in the second).
SINGLE_EVENT_ROUND_TRIPS = 2


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
    assert (trips.pipelines, len(trips.in_pipelines), trips.count, trips.waits) == (
        SINGLE_EVENT_PIPELINES,
        SINGLE_EVENT_STATEMENTS,
        SINGLE_EVENT_ROUND_TRIPS,
        SINGLE_EVENT_ROUND_TRIPS,
    )
    assert trips.in_pipelines[-1] == "COMMIT"
    # ... and the statements did their work
    assert Step.objects.get(run=run, key="warm").status == "completed"
    assert EventReceipt.objects.get(run=run, event_id="c").outcome == "accepted"
    assert reload(run).change_seq == run.change_seq + 1


def test_a_new_step_is_two_pipelines_too(warm, monkeypatch):
    run, token = warm
    with RoundTrips().counting(monkeypatch) as trips:
        statuses = _ingest(run, token, [{"event_id": "s", "type": "step.started", "key": "next"}])
    assert statuses == ["accepted"]
    assert (trips.count, trips.waits, len(trips.in_pipelines)) == (
        SINGLE_EVENT_ROUND_TRIPS,
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
    # the opening pipeline and the COMMIT (of nothing: no writes to send it with)
    assert (trips.count, trips.waits, len(trips.in_pipelines)) == (2, 2, 4)


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
    # The policies' read is in the second pipeline, not a round trip of its own; what they
    # write comes after it, so the COMMIT is a round trip of its own.
    read, _params = read_for_checks_statement(run.pk)
    assert read in trips.in_pipelines
    assert read not in trips.alone
    assert "COMMIT" not in trips.in_pipelines
    assert trips.commits == 1


def test_a_team_whose_policies_do_not_look_at_events_commits_with_the_writes(warm, monkeypatch):
    run, token = warm
    policy(run.team, "loop", "call.repeats >= 50")  # evaluated at permits, not at batches
    # The first batch after a change of the team's policies reads them (once per process).
    assert _ingest(run, token, [{"event_id": "s", "type": "step.started", "key": "warm"}]) == [
        "accepted"
    ]
    with RoundTrips().counting(monkeypatch) as trips:
        statuses = _ingest(run, token, [{"event_id": "c", "type": "step.completed", "key": "warm"}])
    assert statuses == ["accepted"]
    assert (trips.count, trips.waits, trips.commits) == (2, 2, 0)
    assert trips.in_pipelines[-1] == "COMMIT"
    assert Step.objects.get(run=run, key="warm").status == "completed"


def test_a_batch_with_spend_commits_after_charging_it(warm, monkeypatch):
    run, token = warm
    usage = {"type": "usage", "model": "x", "input_tokens": 1, "output_tokens": 1}
    with RoundTrips().counting(monkeypatch) as trips:
        statuses = _ingest(run, token, [{"event_id": "u", **usage, "cost_usd": 0.5}])
    assert statuses == ["accepted"]
    assert "COMMIT" not in trips.in_pipelines
    assert trips.commits == 1
    assert float(reload(run).cost_usd) == 0.5
