"""Bad input on the console is a 4xx or a message, never a 500. One test per
class of input; tests/faults/test_fuzz_inputs.py drives every pattern with many more values."""

from __future__ import annotations

import base64

import pytest
from channels.testing import HttpCommunicator
from django.core.asgi import get_asgi_application
from django.test import Client

from console.selectors.runs import cursor_decode
from console.static import StaticFiles
from runs.models import Run
from tests.support.scenarios import new_run

pytestmark = pytest.mark.django_db


def _cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize("run_id", ["%00", "run_%00x", "%ED%A0%80", "x" * 40, "..%2F.."])
def test_a_path_no_run_id_can_be_is_a_404(as_reviewer: Client, team, run_id: str) -> None:
    assert as_reviewer.get(f"/runs/{run_id}/").status_code == 404
    assert as_reviewer.post(f"/runs/{run_id}/stop/", {"reason": "user_stop"}).status_code == 404


@pytest.mark.parametrize(
    "stamp",
    [
        "2024-02-30T00:00:00+00:00",  # well formed, impossible
        "0001-01-01T00:00:00+23:59",  # before year 1 in UTC
        "2024-01-01T00:00:00",  # naive: never one of ours
    ],
)
def test_a_forged_runs_cursor_shows_the_first_page(as_reviewer: Client, team, stamp: str) -> None:
    run = new_run(team)
    for cursor in (_cursor(f"{stamp}|{run.pk}"), _cursor(f"{run.created_at.isoformat()}|\x00")):
        assert cursor_decode(cursor) is None
        for key in ("after", "before"):
            response = as_reviewer.get("/", {key: cursor})
            assert response.status_code == 200 and run.pk in response.content.decode()


def test_a_cursor_with_an_offset_postgresql_refuses_is_read_in_utc(as_reviewer: Client, team):
    run = new_run(team)
    cursor = _cursor(f"9999-12-31T23:59:59+23:59|{run.pk}")
    stamp, _run_id = cursor_decode(cursor) or (None, None)
    assert stamp is not None and stamp.utcoffset().total_seconds() == 0
    assert as_reviewer.get("/", {"after": cursor}).status_code == 200


def test_a_real_cursor_still_pages(team) -> None:
    run = new_run(team)
    decoded = cursor_decode(_cursor(f"{run.created_at.isoformat()}|{run.pk}"))
    assert decoded == (run.created_at, run.pk)


@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"])
def test_audit_dates_past_the_calendar_are_a_form_error(as_admin: Client, value: str) -> None:
    for key in ("since", "until"):
        response = as_admin.get("/audit/", {key: value})
        assert response.status_code == 200
        assert "This date is out of range." in response.content.decode()
        # An unreadable filter never exports the whole ledger: 400, saying which field.
        export = as_admin.get("/audit.csv", {key: value})
        assert export.status_code == 400
        assert "This date is out of range." in export.content.decode()


def test_audit_dates_with_offsets_postgresql_refuses_are_read_in_utc(as_admin: Client) -> None:
    for value in ("0001-01-01T00:00:00-23:59", "9999-12-31T23:59:59+23:59"):
        response = as_admin.get("/audit/", {"since": value})
        assert response.status_code == 200
        assert "Some filters were not understood" not in response.content.decode()


def test_a_quality_period_ending_on_the_calendars_last_day_is_a_form_error(
    as_reviewer: Client, team
) -> None:
    response = as_reviewer.get(
        "/quality/", {"period": "custom", "since": "9999-12-31", "until": "9999-12-31"}
    )
    assert response.status_code == 200
    assert "The end date must be before 9999-12-31." in response.content.decode()
    first = as_reviewer.get("/quality/", {"since": "0001-01-01", "until": "0001-01-01"})
    assert first.status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/static/../settings.py",
        "/static/console/../../../../etc/passwd",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/console/console.js%00.png",
    ],
)
async def test_a_static_path_outside_the_static_files_is_a_404(path: str) -> None:
    app = StaticFiles(get_asgi_application())
    response = await HttpCommunicator(app, "GET", path).get_response(timeout=5)
    assert response["status"] == 404


async def test_static_files_are_still_served() -> None:
    app = StaticFiles(get_asgi_application())
    communicator = HttpCommunicator(app, "GET", "/static/console/console.js")
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(timeout=5)  # a file streams: read its start only
    assert start["type"] == "http.response.start" and start["status"] == 200
    await communicator.wait(timeout=5)


def test_run_ids_the_console_makes_match_its_urls(team) -> None:
    run = new_run(team)
    assert Run.objects.filter(pk=run.pk).exists()
    client_path = f"/runs/{run.pk}/"
    from django.urls import resolve

    assert resolve(client_path).kwargs == {"run_id": run.pk}


@pytest.mark.parametrize("path", ["/stops/bulk/%00/", "/approvals/%00/", "/api/v1/approvals/%00/"])
def test_a_nul_byte_anywhere_in_a_path_is_a_404(as_admin: Client, path: str) -> None:
    # Whatever `<str:...>` pattern it would reach: no key in the database can hold a NUL.
    response = as_admin.get(path)
    assert response.status_code == 404
    if path.startswith("/api/"):
        assert response.json()["error"] == "not_found"
