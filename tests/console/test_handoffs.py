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
    as_reviewer.post(f"/handoffs/{handoff.pk}/close/", {"note": "nothing left to do"})
    again = as_reviewer.post(f"/handoffs/{handoff.pk}/complete/", {}, **htmx())
    assert again.status_code == 200 and "the handoff is closed" in again.content.decode()
    assert as_reviewer.post(f"/handoffs/{handoff.pk}/explode/").status_code == 404


# ---------------------------------------------------------------- assign, sort, filter, age


def test_assign_to_a_teammate_is_ledgered_and_announced(handoff, alice, bob, team):
    from handoff.services import handoff_assign
    from runs.models import LedgerEntry

    seq = _run(handoff).change_seq
    handoff_assign(handoff_id=handoff.pk, assignee=alice, actor=Actor.for_user(bob))
    handoff.refresh_from_db()
    assert handoff.assignee == alice and handoff.status == "open"
    entry = LedgerEntry.objects.filter(run_id=handoff.run_id).order_by("-run_seq").first()
    assert entry.action == "handoff.assigned" and entry.actor == "bob"
    assert entry.payload["assignee"] == "alice" and entry.payload["previous"] == "bob"
    assert _run(handoff).change_seq == seq + 1  # the inbox and needs-me follow it live
    # the same person again writes nothing
    handoff_assign(handoff_id=handoff.pk, assignee=alice, actor=Actor.for_user(bob))
    assert LedgerEntry.objects.filter(run_id=handoff.run_id, action="handoff.assigned").count() == 1


def test_assign_refuses_who_cannot_act_on_the_run(handoff, charlie, outsider, bob):
    from handoff.services import handoff_assign
    from runs.errors import Forbidden

    for user in (charlie, outsider):  # a viewer of the team; an admin of another team
        with pytest.raises(Forbidden):
            handoff_assign(handoff_id=handoff.pk, assignee=user, actor=Actor.for_user(bob))
    handoff.refresh_from_db()
    assert handoff.assignee.username == "bob"


def test_giving_an_accepted_handoff_to_someone_else_reopens_it(handoff, alice, bob):
    from handoff.services import handoff_accept, handoff_assign

    handoff_accept(handoff_id=handoff.pk, user=bob, actor=Actor.for_user(bob))
    handoff_assign(handoff_id=handoff.pk, assignee=alice, actor=Actor.for_user(bob))
    handoff.refresh_from_db()
    assert (handoff.status, handoff.assignee, handoff.accepted_at) == ("open", alice, None)
    handoff_accept(handoff_id=handoff.pk, user=alice, actor=Actor.for_user(alice))
    handoff.refresh_from_db()
    assert handoff.status == "accepted" and handoff.assignee == alice


def test_assign_to_me_and_to_a_teammate_from_the_inbox(as_admin, handoff, alice, charlie):
    mine = as_admin.post(f"/handoffs/{handoff.pk}/assign/", {"assignee": "me"}, **htmx())
    card = mine.content.decode()
    assert card.lstrip().startswith(f'<article id="handoff-{handoff.pk}"')
    assert "Assigned to you" in card and "assignee <strong>alice</strong>" in card
    given = as_admin.post(f"/handoffs/{handoff.pk}/assign/", {"assignee": "bob"})
    assert given.status_code == 302 and given["Location"] == "/handoffs/"
    handoff.refresh_from_db()
    assert handoff.assignee.username == "bob"
    refused = as_admin.post(f"/handoffs/{handoff.pk}/assign/", {"assignee": "charlie"}, **htmx())
    assert "charlie cannot take it" in refused.content.decode()
    unknown = as_admin.post(f"/handoffs/{handoff.pk}/assign/", {"assignee": "nobody"}, **htmx())
    assert "no active user nobody" in unknown.content.decode()
    as_admin.post(f"/handoffs/{handoff.pk}/assign/", {"assignee": "none"})
    handoff.refresh_from_db()
    assert handoff.assignee is None


def test_a_viewer_cannot_assign(as_viewer, handoff):
    assert as_viewer.post(f"/handoffs/{handoff.pk}/assign/", {"assignee": "me"}).status_code == 403
    assert "Assign to me" not in as_viewer.get("/handoffs/").content.decode()


def _aged(handoff: Handoff, minutes: int) -> None:
    from datetime import timedelta

    from django.utils import timezone

    Handoff.objects.filter(pk=handoff.pk).update(
        created_at=timezone.now() - timedelta(minutes=minutes)
    )


def test_inbox_sorts_by_age_waiting_longest_first(as_reviewer, team, bob):
    old = handed_off(team, by=Actor.for_user(bob), title="Old one").handoffs.get()
    new = handed_off(team, by=Actor.for_user(bob), title="New one").handoffs.get()
    _aged(old, 90)
    _aged(new, 5)
    oldest = as_reviewer.get("/handoffs/").context["cards"]
    assert [card.handoff.pk for card in oldest] == [old.pk, new.pk]
    newest = as_reviewer.get("/handoffs/", {"sort": "newest"}).context["cards"]
    assert [card.handoff.pk for card in newest] == [new.pk, old.pk]


def test_an_unaccepted_handoff_shows_its_age(as_reviewer, as_admin, team):
    # Taken over by the watchdog, not a person: nobody has accepted it yet.
    handoff = handed_off(team, by=Actor.system("watchdog")).handoffs.get()
    _aged(handoff, 90)
    body = as_reviewer.get("/handoffs/").content.decode()
    assert "Waiting to be accepted · handed off" in body and "1 h ago" in body
    as_reviewer.post(f"/handoffs/{handoff.pk}/accept/")
    body = as_reviewer.get("/handoffs/").content.decode()
    assert "Waiting to be accepted" not in body and "Accepted <time" in body


def test_inbox_filters_by_assignee(as_admin, team, bob, alice):
    from handoff.services import handoff_assign

    bobs = handed_off(team, by=Actor.for_user(bob), title="Bob's").handoffs.get()
    alices = handed_off(team, by=Actor.for_user(bob), title="Alice's").handoffs.get()
    nobodys = handed_off(team, by=Actor.for_user(bob), title="Nobody's").handoffs.get()
    handoff_assign(handoff_id=alices.pk, assignee=alice, actor=Actor.for_user(alice))
    handoff_assign(handoff_id=nobodys.pk, assignee=None, actor=Actor.for_user(alice))

    def listed(**query: str) -> set[int]:
        return {card.handoff.pk for card in as_admin.get("/handoffs/", query).context["cards"]}

    assert listed() == {bobs.pk, alices.pk, nobodys.pk}
    assert listed(assignee="me") == {alices.pk} == listed(mine="1")
    assert listed(assignee="bob") == {bobs.pk}
    assert listed(assignee="none") == {nobodys.pk}
    body = as_admin.get("/handoffs/", {"assignee": "bob"}).content.decode()
    assert '<option value="bob" selected>bob</option>' in body
    region = as_admin.get("/handoffs/", {"assignee": "bob"}, **htmx("handoff-list"))
    assert 'data-live-url="/handoffs/?assignee=bob"' in region.content.decode()


def test_inbox_queries_do_not_grow_with_handoffs(as_reviewer, team, bob):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    handed_off(team, by=Actor.for_user(bob))
    with CaptureQueriesContext(connection) as one:
        assert as_reviewer.get("/handoffs/").status_code == 200
    for index in range(5):
        handed_off(team, by=Actor.for_user(bob), title=f"more {index}")
    with CaptureQueriesContext(connection) as six:
        assert len(as_reviewer.get("/handoffs/").context["cards"]) == 6
    assert len(six) == len(one)


def test_close_without_a_reason_is_refused_at_the_field(as_reviewer, handoff):
    refused = as_reviewer.post(f"/handoffs/{handoff.pk}/close/", {"note": "  "}, **htmx())
    assert refused.status_code == 200
    assert "Say why the run is closed." in refused.content.decode()
    handoff.refresh_from_db()
    assert handoff.status != "closed"
    assert _run(handoff).status == RunStatus.HANDED_OFF
    page = as_reviewer.get("/handoffs/").content.decode()
    assert f'id="close-note-{handoff.pk}" name="note" rows="2" required' in page


def test_a_takeover_by_a_reviewer_starts_accepted_by_them(handoff, bob):
    assert handoff.status == "accepted"
    assert handoff.assignee_id == bob.pk and handoff.accepted_at is not None
    entry = handoff.run.ledger_entries.get(action="run.handed_off")
    assert entry.payload["accepted"] is True and entry.payload["assignee"] == "bob"


def test_accepting_a_handoff_assigned_to_someone_else_asks_first(as_admin, team, alice, bob):
    run = handed_off(team, by=Actor.system("watchdog"))
    handoff = run.handoffs.get()
    assert handoff.status == "open" and handoff.assignee is None
    from handoff import services as handoff_services

    handoff_services.handoff_assign(
        handoff_id=handoff.pk, assignee=bob, actor=Actor.for_user(alice)
    )
    page = as_admin.get("/handoffs/").content.decode()
    assert 'data-testid="accept-someone-elses"' in page and "Take it from bob" in page
    refused = as_admin.post(f"/handoffs/{handoff.pk}/accept/", **htmx())
    assert "assigned to bob: confirm to take it from them" in refused.content.decode()
    handoff.refresh_from_db()
    assert (handoff.status, handoff.assignee_id) == ("open", bob.pk)
    taken = as_admin.post(f"/handoffs/{handoff.pk}/accept/", {"take_from_assignee": "on"}, **htmx())
    assert "Accepted" in taken.content.decode()
    handoff.refresh_from_db()
    assert (handoff.status, handoff.assignee_id) == ("accepted", alice.pk)
