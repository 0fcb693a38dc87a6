"""The handoff inbox: accept, complete, return to automation from a checkpoint, close; and the
unapplied steering carried over or discarded."""

from __future__ import annotations

import pytest

from handoff.models import Handoff
from runs.actors import Actor
from runs.models import Run, RunStatus
from tests.support.htmx import htmx
from tests.support.scenarios import handed_off

pytestmark = pytest.mark.django_db


@pytest.fixture
def handoff(team, bob) -> Handoff:
    run = handed_off(team, by=Actor.for_user(bob))
    return run.handoffs.get()


def _run(handoff: Handoff) -> Run:
    return Run.objects.get(pk=handoff.run_id)


def test_inbox_lists_my_teams_and_mine(as_reviewer, as_admin, as_outsider, handoff):
    assert handoff.run.title in as_reviewer.get("/handoffs/").content.decode()
    assert handoff.run.title in as_reviewer.get("/handoffs/", {"mine": "1"}).content.decode()
    assert handoff.run.title not in as_admin.get("/handoffs/", {"mine": "1"}).content.decode()
    assert handoff.run.title not in as_outsider.get("/handoffs/").content.decode()


def test_viewer_reads_but_cannot_act(as_viewer, handoff):
    body = as_viewer.get("/handoffs/").content.decode()
    assert handoff.run.title in body and "Confirm return" not in body
    assert as_viewer.post(f"/handoffs/{handoff.pk}/accept/").status_code == 403


def test_accept_then_complete(as_reviewer, handoff):
    accepted = as_reviewer.post(f"/handoffs/{handoff.pk}/accept/", **htmx())
    assert accepted.status_code == 200 and "Accepted" in accepted.content.decode()
    handoff.refresh_from_db()
    assert handoff.status == "accepted"
    done = as_reviewer.post(f"/handoffs/{handoff.pk}/complete/", {"note": "finished by hand"})
    assert done.status_code == 302 and done["Location"] == "/handoffs/"
    handoff.refresh_from_db()
    assert handoff.status == "completed" and _run(handoff).status == RunStatus.COMPLETED


def test_return_to_automation_from_a_checkpoint_carrying_steering(as_reviewer, handoff):
    response = as_reviewer.post(
        f"/handoffs/{handoff.pk}/return/",
        {
            "checkpoint": "checkpoint_01",
            "carry_over_steering": "on",
            "note": "try again",
        },
        **htmx(),
    )
    assert "Returned to automation" in response.content.decode()
    run = _run(handoff)
    assert run.status == RunStatus.PENDING and run.resume_from == "checkpoint_01"
    assert run.steering_messages.get().status == "carried_over"


def test_close_discards(as_reviewer, handoff):
    as_reviewer.post(f"/handoffs/{handoff.pk}/close/", {"note": "not worth it"})
    run = _run(handoff)
    assert run.status == RunStatus.CANCELLED
    assert run.steering_messages.get().status == "discarded"


def test_steering_decided_from_the_inbox(as_reviewer, handoff):
    message = _run(handoff).steering_messages.get()
    response = as_reviewer.post(
        f"/runs/{handoff.run_id}/handoff/steering/{message.pk}/decide/",
        {"decision": "discard"},
        **htmx(),
    )
    body = response.content.decode()
    assert body.lstrip().startswith(f'<article id="handoff-{handoff.pk}"') and "Discarded." in body
    message.refresh_from_db()
    assert message.status == "discarded"


def test_a_refused_action_is_a_message(as_reviewer, handoff):
    as_reviewer.post(f"/handoffs/{handoff.pk}/close/", {})
    again = as_reviewer.post(f"/handoffs/{handoff.pk}/complete/", {}, **htmx())
    assert again.status_code == 200 and "the handoff is closed" in again.content.decode()
    assert as_reviewer.post(f"/handoffs/{handoff.pk}/explode/").status_code == 404
