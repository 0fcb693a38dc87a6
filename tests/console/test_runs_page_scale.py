"""The runs page over many runs (a million is the size it is built for): per-state counts stop at a cap and say so,
the agent list and the search stay exact, and every variant of the page makes as many queries
with a handful of runs as with many."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.selectors import runs as selectors
from tests.support.htmx import htmx
from tests.support.scenarios import completed, interrupted, new_run, stopped_dirty

pytestmark = pytest.mark.django_db


@pytest.fixture
def cap_of_three(monkeypatch):
    monkeypatch.setattr(selectors, "RUNS_COUNT_CAP", 3)


def test_a_count_past_the_cap_shows_the_cap_and_a_plus(as_reviewer, team, cap_of_three):
    for i in range(5):
        new_run(team, title=f"pending {i}")
    stopped_dirty(team)
    body = as_reviewer.get("/").content.decode()
    assert "Pending <b>3+</b>" in body
    assert "Stopped dirty <b>1</b>" in body  # below the cap: exact, no plus
    assert "All <b>4+</b>" in body
    assert "1 run stopped dirty" in body
    pending = as_reviewer.get("/", {"status": "pending"}).content.decode()
    assert "Stop all 3+ matching" in pending
    # bulk.js words "Select all N matching" from the label; the count stays a number it compares
    assert 'data-bulk-matching-count="3" data-bulk-matching-label="3+"' in pending
    assert "· 3+ Pending" in pending or "3+ pending" in pending.lower()


def test_counts_under_the_cap_are_exact(as_reviewer, team):
    for i in range(4):
        new_run(team, title=f"pending {i}")
    completed(team)
    result = as_reviewer.get("/").context["result"]
    assert result.counts == {"pending": 4, "completed": 1}
    assert result.total == 5 and not result.capped


def test_the_agent_list_is_every_distinct_agent_in_order_of_the_users_teams(
    as_reviewer, as_staff, team, other_team
):
    for agent in ("zeta-bot", "alpha-bot", "mid-bot", "alpha-bot"):
        new_run(team, agent=agent)
    new_run(other_team, agent="globex-only-bot")
    mine = as_reviewer.get("/").context["result"].agents
    assert mine == ["alpha-bot", "mid-bot", "zeta-bot"]
    every = as_staff.get("/").context["result"].agents
    assert every == ["alpha-bot", "globex-only-bot", "mid-bot", "zeta-bot"]


def test_search_by_title_is_case_insensitive_and_by_id_fragment_or_prefix(as_staff, team):
    refund = new_run(team, title="Refund ticket #4242")
    other = new_run(team, title="Nightly billing sync")
    by_word = as_staff.get("/", {"q": "REFUND"}).context["result"].rows
    assert [run.pk for run in by_word] == [refund.pk]
    fragment = other.pk.removeprefix("run_")[3:9]
    by_fragment = as_staff.get("/", {"q": fragment}).context["result"].rows
    assert other.pk in [run.pk for run in by_fragment]
    by_prefix = as_staff.get("/", {"q": refund.pk[:10]}).context["result"].rows
    assert refund.pk in [run.pk for run in by_prefix]


def test_the_unresolved_interrupted_banner_counts_and_marks_the_shown_rows(as_reviewer, team):
    unknown = interrupted(team)
    resolved = interrupted(team, write_open=False)
    result = as_reviewer.get("/").context["result"]
    assert result.interrupted_unresolved == 1 and not result.interrupted_capped
    assert result.unresolved_ids == {unknown.pk}
    assert resolved.pk not in result.unresolved_ids


def _variants(cursor: str) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    return [
        ("first page", {}, {}),
        ("status filter", {"status": "pending"}, {}),
        ("agent filter", {"agent": "agent-1"}, {}),
        ("team filter", {"team": "acme"}, {}),
        ("search", {"q": "many"}, {}),
        ("next page", {"after": cursor}, {}),
        ("htmx refresh", {}, htmx("runs-region")),
    ]


def _query_counts(client) -> dict[str, int]:
    newest = client.get("/").context["result"].rows[0]
    # past the newest row: a next page that is not empty with few runs either
    cursor = selectors.cursor_encode(newest.created_at, newest.pk)
    counts = {}
    for label, params, headers in _variants(cursor):
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/", params, **headers).status_code == 200
        counts[label] = len(queries)
    return counts


def _runs(team, other_team, n: int) -> None:
    """The same shape at any size: an unresolved interrupted run and a dirty one on every page
    but the newest row, then `n` pending runs in two teams and four agents."""
    interrupted(team)
    stopped_dirty(team)
    for i in range(n):
        new_run(team if i % 3 else other_team, title=f"many {i}", agent=f"agent-{i % 4}")


@pytest.mark.parametrize("who", ["as_staff", "as_reviewer"])
def test_every_variant_makes_as_many_queries_with_few_runs_as_with_many(
    request, who, team, other_team, cap_of_three
):
    """Small data against more data, past the count cap: the same number of queries."""
    client = request.getfixturevalue(who)
    _runs(team, other_team, 2)
    few = _query_counts(client)
    _runs(team, other_team, 60)
    many = _query_counts(client)
    assert many == few


def test_the_trigram_indexes_exist_on_postgresql():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'runs_run' AND indexname LIKE %s",
            ["%trgm%"],
        )
        names = {name for (name,) in cursor.fetchall()}
    assert names == {"run_title_trgm_idx", "run_id_trgm_idx"}


def test_a_search_past_its_cap_says_at_least(as_staff, team, monkeypatch):
    monkeypatch.setattr(selectors, "SEARCH_COUNT_CAP", 3)
    for i in range(5):
        new_run(team, title=f"Refund ticket {i}")
    new_run(team, title="Nightly billing sync")
    result = as_staff.get("/", {"q": "refund"}).context["result"]
    assert result.total == 3 and result.total_capped
    assert len(result.rows) == 5
    body = as_staff.get("/", {"q": "refund"}).content.decode()
    assert "All <b>3+</b>" in body and "Pending <b>3+</b>" in body


def test_a_search_under_its_cap_counts_exactly(as_staff, team):
    for i in range(2):
        new_run(team, title=f"Refund ticket {i}")
    completed(team, title="Refund done")
    new_run(team, title="Nightly billing sync")
    result = as_staff.get("/", {"q": "refund"}).context["result"]
    assert result.counts == {"pending": 2, "completed": 1}
    assert result.total == 3 and not result.capped
