"""Every answer under /api/ is JSON with an error code (an agent parses every answer),
refusals are one log line with the reason and the caller (not a traceback)."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from tests.support.api import url
from tests.support.scenarios import running

pytestmark = pytest.mark.django_db


def _json_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content[:200]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["error"] == code and body["detail"]
    return body


def test_a_post_without_its_trailing_slash_is_a_json_404_saying_so(bob, team):
    # A session without a CSRF token: the API's own views are CSRF-exempt for tokens and check
    # it themselves for sessions, so a path missing its slash must not meet Django's HTML 403.
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    body = _json_error(
        client.post("/api/v1/runs", "{}", content_type="application/json"), 404, "not_found"
    )
    assert "/api/v1/runs/" in body["detail"]
    run, _lease = running(team)
    answer = _json_error(client.post(url(run, "cancel"), {}), 404, "not_found")
    assert url(run, "cancel/") in answer["detail"]


@pytest.mark.parametrize("path", ["/api/", "/api/v2/runs/", "/api/v1", "/api/nothing"])
def test_paths_under_api_outside_v1_are_json_404s(agent_token, path):
    response = Client().get(path, **agent_token.header)
    _json_error(response, 404, "not_found")
    _json_error(Client().post(path, {}), 404, "not_found")


def test_the_schema_viewer_answers_other_methods_in_json():
    response = Client().options("/api/docs/")
    _json_error(response, 405, "method_not_allowed")
    assert "GET" in response["Allow"]


def test_a_bad_host_header_under_api_is_a_json_400():
    _json_error(Client().get("/api/v1/runs/", HTTP_HOST="evil.example"), 400, "bad_request")


def test_an_api_refusal_is_one_log_line_with_the_caller_and_no_traceback(team, agent_token, caplog):
    run, _lease = running(team)
    with caplog.at_level(logging.INFO):
        response = Client().post(
            url(run, "cancel/"),
            {"reason": "user_stop"},
            content_type="application/json",
            **agent_token.header,
        )
    _json_error(response, 403, "forbidden")
    lines = [r for r in caplog.records if run.pk in r.getMessage() or "cancel" in r.getMessage()]
    refusals = [r for r in lines if r.name == "safestop.refusals"]
    assert len(refusals) == 1 and "agent-1" in refusals[0].getMessage()
    assert refusals[0].levelno == logging.INFO
    assert not any(r.exc_info for r in caplog.records)
    assert not [r for r in lines if r.name == "django.request"]  # no second line
