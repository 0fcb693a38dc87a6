"""One ledger query (runs.ledger_queries): the API's GET /ledger/ and the console's audit page
and CSV export apply the same filter rules."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client

from runs.actors import Actor
from runs.ledger import ledger_append

pytestmark = pytest.mark.django_db


@pytest.fixture
def entries(team):
    """Three team entries without a run, by two people whose names differ only in case."""
    return [
        ledger_append(run=None, actor=Actor.system(name), action=action, team_slug=team.slug).pk
        for name, action in [
            ("Dana", "probe.opened"),
            ("dana", "probe.closed"),
            ("dana", "check.noted"),
        ]
    ]


def _api(client: Client, token, **params) -> list[int]:
    response = client.get("/api/v1/ledger/", params, **token.header)
    assert response.status_code == 200
    return [entry["seq"] for entry in response.json()["results"]]


def _audit_page(client: Client, **params) -> list[int]:
    response = client.get("/audit/", params)
    assert response.status_code == 200
    return [entry.pk for entry in response.context["rows"]]


def _audit_csv(client: Client, **params) -> list[int]:
    response = client.get("/audit.csv", params)
    body = b"".join(response.streaming_content).decode()
    return [int(row["seq"]) for row in csv.DictReader(io.StringIO(body))]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"actor": "dana"}, [2, 1]),  # exact: "Dana" is someone else
        ({"actor": " Dana "}, [0]),
        ({"actor": "DANA"}, []),
        ({"action": "probe.*"}, [1, 0]),  # an action family
        ({"action": "probe.opened"}, [0]),
        ({"actor": "dana", "action": "check.*"}, [2]),
    ],
)
def test_api_page_and_export_filter_the_ledger_alike(
    client, alice, reviewer_token, entries, params, expected
):
    want = [entries[index] for index in expected]
    assert _api(client, reviewer_token, **params) == want
    client.force_login(alice)
    assert _audit_page(client, **params) == want
    assert _audit_csv(client, **params) == want
