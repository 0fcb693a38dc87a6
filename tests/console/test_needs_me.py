"""Needs me: one page for everything on the user's teams that waits for a person, most urgent
first, each row linking to the page that decides it; its count in the navigation; where a
reviewer lands after signing in."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import services
from runs.actors import Actor
from runs.models import Approval, Lease, Run, RunStatus, Team
from tests.support.htmx import htmx
from tests.support.scenarios import AGENT, handed_off, new_run, running, start, stopped_dirty

pytestmark = pytest.mark.django_db

_calls = iter(range(1, 10_000))


def waiting(team: Team, *, title: str = "Refunds", deadline_in: float | None = None) -> Approval:
    """A running run whose write asked for approval (as the agent would)."""
    run = new_run(team, title=title)
    lease = start(run)
    record, _created = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id=f"needs_call_{next(_calls)}",
        tool="payments.refund",
        actor=AGENT,
        side_effect="write",
        arguments={"amount": 120},
        needs_approval=True,
        summary=f"Refund for {title}",
        risk="high",
    )
    approval = Approval.objects.get(execution_record=record)
    if deadline_in is not None:
        Approval.objects.filter(pk=approval.pk).update(
            deadline=timezone.now() + timedelta(seconds=deadline_in)
        )
        approval.refresh_from_db()
    return approval


def interrupted_with_a_write(team: Team, *, title: str = "Deploy") -> Run:
    """The worker vanished while a write was in flight: the lease expired, the run interrupted."""
    run, lease = running(team, title=title, write_open=True)
    Lease.objects.filter(pk=lease.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    services.lease_expire(lease_id=lease.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    return run


def test_everything_waiting_is_grouped_by_kind_approvals_first_with_its_deciding_page(
    as_reviewer, team, bob
):
    later = waiting(team, title="Later refund", deadline_in=3600)
    dirty = stopped_dirty(team, title="Dirty report")
    broken = interrupted_with_a_write(team, title="Broken deploy")
    handoff = handed_off(team, by=Actor.for_user(bob), title="Handed report").handoffs.get()
    soon = waiting(team, title="Soon refund", deadline_in=60)
    running(team, title="Busy and fine")  # needs nobody

    response = as_reviewer.get("/needs-me/")
    body = response.content.decode()
    assert response.status_code == 200
    kinds = [item.kind for item in response.context["items"]]
    # Approvals first, the soonest deadline first; then dirty stops, interrupted runs, handoffs.
    assert kinds == ["approval", "approval", "stopped_dirty", "interrupted", "handoff"]
    order = [
        body.index(f'href="/approvals/{soon.public_id}/"'),
        body.index(f'href="/approvals/{later.public_id}/"'),
        body.index(f'href="/runs/{dirty.pk}/packet/"'),
        body.index(f'href="/runs/{broken.pk}/packet/"'),
        body.index(f'href="/handoffs/#handoff-{handoff.pk}"'),
    ]
    assert order == sorted(order)
    assert "Busy and fine" not in body
    assert "1 unconfirmed side effect" in body
    assert 'id="nav-needs-count" class="nav-count" >5<' in body


def test_only_my_teams_and_only_where_i_may_act(as_viewer, as_outsider, as_admin, team):
    waiting(team)
    stopped_dirty(team)
    assert as_outsider.get("/needs-me/").context["items"] == []
    viewer = as_viewer.get("/needs-me/")
    assert viewer.context["items"] == []
    assert "takes the reviewer role" in viewer.content.decode()
    assert 'href="/needs-me/"' not in viewer.content.decode()  # no nav link for a viewer
    assert len(as_admin.get("/needs-me/").context["items"]) == 2


def test_an_accepted_handoff_needs_only_its_assignee(as_reviewer, as_admin, team, bob):
    # Taken over by the watchdog: open to the team until someone accepts it.
    handoff = handed_off(team, by=Actor.system("watchdog")).handoffs.get()
    assert [i.kind for i in as_admin.get("/needs-me/").context["items"]] == ["handoff"]
    as_reviewer.post(f"/handoffs/{handoff.pk}/accept/")
    assert as_admin.get("/needs-me/").context["items"] == []
    items = as_reviewer.get("/needs-me/").context["items"]
    assert [i.handoff.pk for i in items] == [handoff.pk]


def test_the_count_is_in_the_navigation_of_every_page(as_reviewer, team):
    waiting(team)
    stopped_dirty(team)
    body = as_reviewer.get("/handoffs/").content.decode()
    assert 'id="nav-needs-count" class="nav-count" >2<' in body
    assert 'id="nav-approvals-count" class="nav-count" >1<' in body


def test_htmx_refresh_returns_the_list_and_the_nav_counts(as_reviewer, team):
    dirty = stopped_dirty(team)
    response = as_reviewer.get("/needs-me/", **htmx("needs-me-region"))
    body = response.content.decode()
    assert "<html" not in body and body.lstrip().startswith('<section id="needs-me-region"')
    assert dirty.pk in body
    assert 'id="nav-needs-count" class="nav-count" hx-swap-oob="true">1<' in body
    assert 'id="nav-approvals-count"' in body and 'ws-connect="/ws/runs/"' not in body


def test_the_page_follows_the_team_socket(as_reviewer, team):
    stopped_dirty(team)
    body = as_reviewer.get("/needs-me/").content.decode()
    assert 'ws-connect="/ws/runs/"' in body and 'data-live-filter="needs"' in body


def test_queries_do_not_grow_with_what_waits(as_reviewer, team, bob, django_assert_max_num_queries):
    waiting(team)
    stopped_dirty(team)
    interrupted_with_a_write(team)
    handed_off(team, by=Actor.for_user(bob))
    with CaptureQueriesContext(connection) as few:
        assert len(as_reviewer.get("/needs-me/").context["items"]) == 4
    for index in range(4):
        waiting(team, title=f"refund {index}")
        stopped_dirty(team, title=f"dirty {index}")
        interrupted_with_a_write(team, title=f"deploy {index}")
        handed_off(team, by=Actor.for_user(bob), title=f"handed {index}")
    with CaptureQueriesContext(connection) as many:
        assert len(as_reviewer.get("/needs-me/").context["items"]) == 20
    assert len(many) == len(few)
    with django_assert_max_num_queries(len(few)):
        as_reviewer.get("/needs-me/", **htmx("needs-me-region"))


def test_the_navigation_counts_cost_one_query(as_reviewer, team, django_assert_num_queries):
    waiting(team)
    stopped_dirty(team)
    as_reviewer.get("/tokens/")  # warm the session
    with CaptureQueriesContext(connection) as queries:
        as_reviewer.get("/handoffs/")
    counting = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
    assert len(counting) == 1


def test_a_reviewer_with_something_waiting_lands_on_needs_me(client, bob, team):
    assert client.post("/login/", {"username": "bob", "password": "pw-bob"})["Location"] == (
        "/home/"
    )
    assert client.get("/home/")["Location"] == "/"
    stopped_dirty(team)
    assert client.get("/home/")["Location"] == "/needs-me/"


def test_a_viewer_lands_on_the_runs_page(client, charlie, team):
    stopped_dirty(team)
    client.force_login(charlie)
    assert client.get("/home/")["Location"] == "/"


def test_a_user_of_no_team_sees_nothing_and_counts_zero(client, team, django_user_model):
    stopped_dirty(team)
    waiting(team)
    client.force_login(django_user_model.objects.create_user("loner", password="pw-loner"))
    response = client.get("/needs-me/")
    assert response.status_code == 200 and response.context["items"] == []
    assert 'id="nav-approvals-count" class="nav-count is-zero" >0<' in response.content.decode()
    assert client.get("/home/")["Location"] == "/"


def test_each_group_is_counted_and_the_badge_agrees_with_the_groups(as_reviewer, team, bob):
    for index in range(3):
        waiting(team, title=f"refund {index}")
    stopped_dirty(team)
    interrupted_with_a_write(team)
    handed_off(team, by=Actor.for_user(bob))
    response = as_reviewer.get("/needs-me/")
    body = response.content.decode()
    counts = {group.kind: group.count for group in response.context["groups"]}
    assert counts == {"approval": 3, "stopped_dirty": 1, "interrupted": 1, "handoff": 1}
    assert 'data-kind-count="approval">3<' in body
    assert 'id="nav-needs-count" class="nav-count" >6<' in body
    # the badge of any other page says the same
    other = as_reviewer.get("/nav-counts/", **htmx("nav-needs-count")).content.decode()
    assert 'id="nav-needs-count" class="nav-count" hx-swap-oob="true">6<' in other
    assert 'id="nav-approvals-count" class="nav-count" hx-swap-oob="true">3<' in other


def test_the_kind_filter_shows_one_group_and_pages_through_it(as_reviewer, team):
    from console.selectors.needs_me import NEEDS_ME_GROUP_PAGE

    made = [
        waiting(team, title=f"refund {index}", deadline_in=600 + index)
        for index in range(NEEDS_ME_GROUP_PAGE + 2)
    ]
    stopped_dirty(team)
    everything = as_reviewer.get("/needs-me/")
    approvals = everything.context["groups"][0]
    assert approvals.kind == "approval" and len(approvals.items) < approvals.count
    assert 'href="/needs-me/?kind=approval"' in everything.content.decode()

    first = as_reviewer.get("/needs-me/?kind=approval")
    assert [group.kind for group in first.context["groups"]] == ["approval"]
    shown = [item.approval.pk for item in first.context["items"]]
    assert shown == [approval.pk for approval in made[:NEEDS_ME_GROUP_PAGE]]
    assert "page=2" in first.content.decode()
    second = as_reviewer.get("/needs-me/?kind=approval&page=2")
    assert [item.approval.pk for item in second.context["items"]] == [
        approval.pk for approval in made[NEEDS_ME_GROUP_PAGE:]
    ]
    dirty = as_reviewer.get("/needs-me/?kind=stopped_dirty").context["items"]
    assert [item.kind for item in dirty] == ["stopped_dirty"]


def test_an_unreadable_kind_or_page_shows_nothing_and_says_why(as_reviewer, team):
    waiting(team)
    for query in ("kind=everything", "page=zero", "kind=approval&page=-1"):
        response = as_reviewer.get(f"/needs-me/?{query}")
        assert response.status_code == 200
        assert response.context["items"] == []
        assert 'data-testid="needs-filter-errors"' in response.content.decode()


def test_the_urgent_rows_have_a_legend(as_reviewer, team):
    waiting(team, deadline_in=60)
    body = as_reviewer.get("/needs-me/").content.decode()
    assert 'id="needs-legend"' in body and "expires within 10 min" in body
    assert "is-urgent" in body


def test_a_handoff_says_when_it_was_handed_off(as_reviewer, team):
    handed_off(team, by=Actor.system("watchdog"))  # open: nobody has accepted it
    body = as_reviewer.get("/needs-me/").content.decode()
    assert "handed off <time" in body and "waiting <time" not in body


def test_a_viewers_navigation_counts_have_no_needs_me_part(as_viewer, team):
    waiting(team)
    body = as_viewer.get("/nav-counts/", **htmx()).content.decode()
    assert 'id="nav-needs-count"' not in body  # a viewer's navigation has no such link
    assert 'id="nav-approvals-count" class="nav-count" hx-swap-oob="true">1<' in body
