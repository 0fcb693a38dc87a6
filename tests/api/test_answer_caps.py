"""Bounded answers: a list of approvals carries a summary of each one's arguments (the detail
has them whole), and every list page stops adding items past SAFESTOP_API_PAGE_MAX_BYTES, its
`next` continuing from the first item left out."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.actors import Actor
from runs.models import Approval
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")


@pytest.fixture(autouse=True)
def _no_rate_limit(settings):
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 0


def _held(team: Any, n: int, arguments: dict[str, Any]) -> Approval:
    run, _ = make_running(team)
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=1,
        tool_call_id=f"call_{n}",
        tool="upload",
        side_effect="write",
        arguments=arguments,
        needs_approval=True,
        arguments_schema={"type": "object"} if n % 2 else None,
        actor=AGENT,
    )
    return Approval.objects.get(execution_record=record)


def test_the_list_summarises_arguments_and_the_detail_has_them_whole(api, team, reviewer_token):
    big = {"blob": "x" * 300_000, "name": "report.pdf"}
    held = [_held(team, n, big) for n in range(3)]
    with CaptureQueriesContext(connection) as queries:
        listed = api.get("/api/v1/approvals/", reviewer_token, limit=500)
    assert listed.status_code == 200
    assert len(listed.content) < 20_000  # three approvals of 300 kB each
    rows = listed.json()["results"]
    assert {row["id"] for row in rows} == {a.public_id for a in held}
    for row in rows:
        assert not {"arguments", "original_arguments", "arguments_schema"} & set(row)
        assert row["arguments_summary"].startswith('{"blob": "xxx')
        assert len(row["arguments_summary"]) == 300
        assert row["arguments_truncated"] is True
        assert row["arguments_chars"] > 300_000
    assert sorted(row["has_arguments_schema"] for row in rows) == [False, False, True]
    # the list never reads the arguments themselves out of the database
    page_query = next(q["sql"] for q in queries.captured_queries if "runs_approval" in q["sql"])
    assert '"runs_approval"."arguments",' not in page_query
    detail = api.get(f"/api/v1/approvals/{held[0].public_id}/", reviewer_token)
    assert detail.json()["arguments"] == big


def test_a_small_argument_summary_is_whole(api, team, reviewer_token):
    _held(team, 1, {"a": 1})
    row = api.get("/api/v1/approvals/", reviewer_token).json()["results"][0]
    assert (row["arguments_summary"], row["arguments_truncated"]) == ('{"a": 1}', False)


@pytest.mark.parametrize("path", ["/api/v1/approvals/", "/api/v1/ledger/", "/api/v1/runs/"])
def test_a_page_stops_at_its_byte_cap_and_next_continues(api, team, reviewer_token, settings, path):
    for n in range(9):
        _held(team, n, {"text": "y" * 900, "n": n})
    every = [row["id"] if "id" in row else row["seq"] for row in _all(api, reviewer_token, path)]
    settings.SAFESTOP_API_PAGE_MAX_BYTES = 2500
    pages, collected, link = 0, [], f"{path}?limit=500"
    while link:
        answer = api.get(link, reviewer_token)
        assert answer.status_code == 200
        body = answer.json()
        assert body["results"], "a page always carries one item at least"
        assert len(answer.content) < 2500 + 2000  # the cap, and at most one item past it
        collected += [row["id"] if "id" in row else row["seq"] for row in body["results"]]
        link = body["next"]
        pages += 1
    assert pages >= 2
    assert collected == every  # nothing missed, nothing twice, same order


def _all(api: Any, token: Any, path: str) -> list[dict[str, Any]]:
    answer = api.get(path, token, limit=500)
    assert answer.json()["next"] is None
    return answer.json()["results"]
