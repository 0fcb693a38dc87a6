"""A refused console request is one log line with the reason and the user, not a traceback
(a traceback reads as a bug, and buries the refusals an operator looks for)."""

from __future__ import annotations

import logging

import pytest

from runs.models import RunStatus
from tests.support.scenarios import running

pytestmark = pytest.mark.django_db


def test_a_refused_stop_is_one_info_line_naming_the_user_and_why(as_viewer, team, caplog):
    run, _lease = running(team)
    with caplog.at_level(logging.INFO):
        response = as_viewer.post(f"/runs/{run.pk}/stop/", {"reason": "user_stop"})
    assert response.status_code == 403
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert not any(record.exc_info for record in caplog.records)
    refusals = [r for r in caplog.records if r.name == "safestop.refusals"]
    assert len(refusals) == 1
    line = refusals[0].getMessage()
    assert refusals[0].levelno == logging.INFO
    assert "charlie" in line and f"/runs/{run.pk}/stop/" in line and "reviewer" in line
    assert not [r for r in caplog.records if r.name == "django.request"]
