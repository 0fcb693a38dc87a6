"""Every error is JSON with a stable code, and no input produces a 500."""

from __future__ import annotations

import json

import pytest

from runs.models import ExecutionRecord
from tests.support.api import url
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db


def assert_error(response, status, code):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert body["error"] == code
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def test_no_credentials_is_401(api):
    response = api.get("/api/v1/runs/")
    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "header", ["Bearer ss_unknown", "Bearer", "Token abc", "Bearer a b", "Bearer \x00"]
)
def test_bad_tokens_are_401(api, header):
    assert_error(
        api.client.get("/api/v1/runs/", HTTP_AUTHORIZATION=header), 401, "authentication_failed"
    )


def test_a_body_over_the_limit_is_413(api, team, agent_token, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2_000
    run, _ = make_running(team)
    body = {"epoch": 1, "tool_call_id": "c", "tool": "t", "arguments": {"blob": "x" * 5_000}}
    assert_error(api.post(url(run, "permits/"), body, agent_token), 413, "request_too_large")
    assert not ExecutionRecord.objects.exists()


@pytest.mark.parametrize("raw", ["[]", '"text"', "5", "null", "true", "[{}]"])
def test_json_that_is_not_an_object_is_400(api, team, agent_token, raw):
    run, _ = make_running(team)
    assert_error(api.post(url(run, "permits/"), raw=raw, token=agent_token), 400, "invalid")


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        '{"epoch": NaN}',
        '{"epoch": Infinity}',
        '{"x": 1e400}',
        '{"epoch": ' + "9" * 5000 + "}",
        "[" * 100_000 + "]" * 100_000,
        '{"a": ' * 70 + "1" + "}" * 70,
        b"\xff\xfe{}",
    ],
)
def test_malformed_json_is_400(api, team, agent_token, raw):
    run, _ = make_running(team)
    assert_error(api.post(url(run, "permits/"), raw=raw, token=agent_token), 400, "parse_error")


def test_huge_and_mistyped_numbers_are_400_naming_the_field(api, team, agent_token):
    run, _ = make_running(team)
    for epoch in (10**100, 1.5, "1e3", True, [1], {"n": 1}):
        body = assert_error(
            api.post(
                url(run, "permits/"),
                {"epoch": epoch, "tool_call_id": "c", "tool": "t"},
                agent_token,
            ),
            400,
            "invalid",
        )
        assert body["field"] == "epoch"


def test_unicode_nul_and_lone_surrogates_are_stored_not_crashed_on(api, team, agent_token):
    run, _ = make_running(team)
    raw = json.dumps(
        {
            "epoch": 1,
            "tool_call_id": "ç-😀",
            "tool": "t",
            "arguments": {"k\u0000ey": "nul\u0000byte", "s": "\ud800lone"},
        }
    )
    response = api.post(url(run, "permits/"), raw=raw, token=agent_token)
    assert response.status_code == 201
    record = ExecutionRecord.objects.get()
    assert record.tool_call_id == "ç-😀"
    assert record.arguments == {"k\ufffdey": "nul\ufffdbyte", "s": "\ufffdlone"}
    text = api.post(
        url(run, "tool-calls/%C3%A7-%F0%9F%98%80/result/"),
        {"execution_state": "succeeded", "observation": "bin\u0000ary"},
        agent_token,
    )
    assert text.status_code == 200


def test_form_bodies_are_415(api, team, agent_token):
    run, _ = make_running(team)
    response = api.post(
        url(run, "permits/"),
        raw="epoch=1",
        token=agent_token,
        content_type="application/x-www-form-urlencoded",
    )
    assert_error(response, 415, "unsupported_media_type")


def test_unknown_paths_and_methods_answer_json(api, team, agent_token):
    run, _ = make_running(team)
    assert_error(api.get("/api/v1/nothing-here/", agent_token), 404, "not_found")
    assert_error(api.client.delete(url(run), **agent_token.header), 405, "method_not_allowed")
    assert_error(api.get(url(run, "permits/"), agent_token), 405, "method_not_allowed")


@pytest.mark.parametrize("run_id", ["run_%00", "x" * 200, "%F0%9F%98%80", "run_1;drop", "..%2F"])
def test_strange_run_ids_are_404(api, agent_token, run_id):
    assert_error(api.get(f"/api/v1/runs/{run_id}/", agent_token), 404, "not_found")


def test_strange_query_values_are_400_not_500(api, agent_token, reviewer_token):
    assert api.get("/api/v1/runs/", agent_token, status="\x00").status_code == 400
    assert api.get("/api/v1/ledger/", reviewer_token, actor="\x00").status_code == 400
    assert api.get("/api/v1/ledger/", reviewer_token, run="\x00").status_code == 400
    assert (
        api.get(
            "/api/v1/metrics/stop-quality/", agent_token, since="9999-12-31T23:59:59+14:00"
        ).status_code
        == 400
    )
    assert (
        api.get(
            "/api/v1/metrics/stop-quality/", agent_token, since="0001-01-01T00:00:00+14:00"
        ).status_code
        == 400
    )
    assert (
        api.get(
            "/api/v1/metrics/stop-quality/", agent_token, until="0001-01-01T00:00:01Z"
        ).status_code
        == 200
    )


def _cursor(position: str) -> str:
    import base64
    from urllib.parse import urlencode

    return base64.b64encode(urlencode({"p": position}).encode()).decode()


# The runs list pages by creation time, the ledger by sequence number: a position that is not
# one is forged (or corrupted), whatever a client meant by it.
FORGED_CURSORS = [
    ("/api/v1/runs/", "garbage"),
    ("/api/v1/runs/", "\x00"),
    ("/api/v1/runs/", "9" * 40),
    ("/api/v1/ledger/", "garbage"),
    ("/api/v1/ledger/", "\x00"),
    ("/api/v1/ledger/", "2020-01-01 00:00:00+00:00"),
]


@pytest.mark.parametrize(("path", "position"), FORGED_CURSORS)
def test_a_forged_cursor_is_404_not_500(api, team, reviewer_token, path, position):
    response = api.get(path, reviewer_token, cursor=_cursor(position))
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": "Invalid cursor"}


@pytest.mark.parametrize(
    ("path", "position"),
    [("/api/v1/runs/", "2020-01-01 00:00:00+00:00"), ("/api/v1/ledger/", "9" * 40)],
)
def test_a_hand_made_cursor_of_the_right_kind_is_an_ordinary_page(
    api, team, reviewer_token, path, position
):
    response = api.get(path, reviewer_token, cursor=_cursor(position))
    assert response.status_code == 200
    assert isinstance(response.json()["results"], list)
