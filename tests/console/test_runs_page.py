"""The runs page: login and scoping, counts per state, filters, search, keyset pagination,
htmx fragments, and a query count that does not grow with the number of runs."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs.models import Run
from tests.support.htmx import htmx
from tests.support.scenarios import new_run, stopped_dirty

pytestmark = pytest.mark.django_db

RUNS_PAGE_MAX_QUERIES = 10  # + the nav count of waiting approvals, + the runs waiting for one


def test_anonymous_is_sent_to_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_login_with_password_lands_on_runs(client, bob):
    response = client.post("/login/", {"username": "bob", "password": "pw-bob"})
    assert response.status_code == 302
    assert response["Location"] == "/home/"  # nothing needs bob: on to the runs page
    assert client.get("/home/")["Location"] == "/"
    page = client.get("/")
    assert page.status_code == 200
    assert b"Runs" in page.content and b"reviewer" in page.content


def test_wrong_password_shows_an_error(client, bob):
    response = client.post("/login/", {"username": "bob", "password": "nope"})
    assert response.status_code == 200
    assert b"do not match" in response.content


def test_runs_of_other_teams_are_not_listed(as_reviewer, team, other_team):
    mine = new_run(team, title="Acme thing")
    theirs = new_run(other_team, title="Globex secret")
    body = as_reviewer.get("/").content.decode()
    assert mine.pk in body
    assert theirs.pk not in body and "Globex secret" not in body


def test_staff_see_every_team(as_staff, team, other_team):
    runs = [new_run(team), new_run(other_team)]
    body = as_staff.get("/").content.decode()
    assert all(run.pk in body for run in runs)


def test_counts_per_state_and_dirty_runs_stand_out(as_reviewer, team, bob):
    from runs.actors import Actor

    new_run(team)
    new_run(team)
    dirty = stopped_dirty(team, by=Actor.for_user(bob))
    body = as_reviewer.get("/").content.decode()
    assert "1 run stopped dirty" in body
    assert 'class="row--attention"' in body
    assert f'href="/runs/{dirty.pk}/packet/">needs resolution' in body
    # the state strip counts two pending runs and one dirty run
    assert "state-pill--pending" in body and "Pending <b>2</b>" in body
    assert "Stopped dirty <b>1</b>" in body


def test_filter_by_status_agent_team_and_search(as_staff, team, other_team):
    first = new_run(team, title="Deploy the docs", agent="deployer")
    second = new_run(team, title="Weekly digest", agent="digest-bot")
    third = new_run(other_team, title="Deploy globex", agent="deployer")
    by_agent = as_staff.get("/", {"agent": "deployer"}).content.decode()
    assert first.pk in by_agent and third.pk in by_agent and second.pk not in by_agent
    by_team = as_staff.get("/", {"team": "acme", "agent": "deployer"}).content.decode()
    assert first.pk in by_team and third.pk not in by_team
    by_title = as_staff.get("/", {"q": "digest"}).content.decode()
    assert second.pk in by_title and first.pk not in by_title
    by_id = as_staff.get("/", {"q": third.pk}).content.decode()
    assert third.pk in by_id and first.pk not in by_id
    by_status = as_staff.get("/", {"status": "running"}).content.decode()
    assert first.pk not in by_status  # all three are pending
    assert "No runs match these filters" in by_status


def test_keyset_pagination_walks_every_run_once(as_reviewer, team):
    created = {new_run(team, title=f"run {i}").pk for i in range(57)}
    first = as_reviewer.get("/")
    page_one = first.context["result"]
    assert len(page_one.rows) == 50 and page_one.has_older and not page_one.has_newer
    second = as_reviewer.get("/", {"after": page_one.older_cursor})
    page_two = second.context["result"]
    assert len(page_two.rows) == 7 and not page_two.has_older and page_two.has_newer
    seen = [run.pk for run in page_one.rows] + [run.pk for run in page_two.rows]
    assert len(seen) == len(set(seen)) == 57 and set(seen) == created
    back = as_reviewer.get("/", {"before": page_two.newer_cursor}).context["result"]
    assert [run.pk for run in back.rows] == [run.pk for run in page_one.rows]
    # newest first, on (created_at, id)
    ordered = list(Run.objects.order_by("-created_at", "-pk").values_list("pk", flat=True)[:50])
    assert [run.pk for run in page_one.rows] == ordered


def test_a_tampered_cursor_is_the_first_page_not_a_500(as_reviewer, team):
    new_run(team)
    response = as_reviewer.get("/", {"after": "!!not-a-cursor!!"})
    assert response.status_code == 200
    assert len(response.context["result"].rows) == 1


def test_htmx_refresh_returns_the_table_region_only(as_reviewer, team):
    run = new_run(team)
    response = as_reviewer.get("/", {"status": "pending"}, **htmx("runs-region"))
    body = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in body
    assert body.lstrip().startswith('<section id="runs-region"')
    assert run.pk in body
    # The filter form is the page's one copy of the query: a refresh never rewrites it.
    assert 'id="f-status"' not in body and "hx-swap-oob" not in body
    assert response["Vary"] and "HX-Request" in response["Vary"]


def test_runs_page_queries_do_not_grow_with_rows(as_reviewer, team, django_assert_max_num_queries):
    for i in range(5):
        new_run(team, title=f"few {i}", agent=f"agent-{i}")
    with CaptureQueriesContext(connection) as few:
        assert as_reviewer.get("/").status_code == 200
    for i in range(45):
        new_run(team, title=f"many {i}", agent=f"agent-{i % 9}")
    with CaptureQueriesContext(connection) as many:
        assert as_reviewer.get("/").status_code == 200
    assert len(many) == len(few)
    with django_assert_max_num_queries(RUNS_PAGE_MAX_QUERIES):
        as_reviewer.get("/", {"status": "pending", "q": "many"})
    with django_assert_max_num_queries(RUNS_PAGE_MAX_QUERIES):
        as_reviewer.get("/", **htmx("runs-region"))


def test_htmx_and_its_websocket_extension_come_from_our_static_files(as_reviewer, team):
    body = as_reviewer.get("/").content.decode()
    assert '<script src="/static/django_htmx/htmx-2.min.js"' in body
    assert '<script src="/static/django_htmx/ext/hx-ws-2.min.js"' in body
    assert 'src="http' not in body and "cdn" not in body.lower()  # no CDN, nothing third-party
    assert 'hx-headers=\'{"X-CSRFToken": "' in body  # CSRF for every htmx request, on <body>
    assert 'ws-connect="/ws/runs/"' in body


def test_runs_path_redirects_to_the_runs_page(as_reviewer):
    response = as_reviewer.get("/runs/", {"status": "running"})
    assert response.status_code == 302 and response["Location"] == "/?status=running"
