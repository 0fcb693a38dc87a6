"""OpenAPI 3 at /api/schema/, Swagger UI at /api/docs/ from our own static files, and
schemathesis against the schema: no 5xx, every answer as documented."""

from __future__ import annotations

import pytest
import schemathesis
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.runs.factories import make_run, make_running
from tests.support.api import stop

pytestmark = pytest.mark.django_db

DESIGN_PATHS = [
    ("post", "/api/v1/runs/"),
    ("get", "/api/v1/runs/"),
    ("get", "/api/v1/runs/{run_id}/"),
    ("post", "/api/v1/runs/{run_id}/lease/"),
    ("post", "/api/v1/runs/{run_id}/lease/heartbeat/"),
    ("post", "/api/v1/runs/{run_id}/lease/release/"),
    ("post", "/api/v1/runs/{run_id}/permits/"),
    ("post", "/api/v1/runs/{run_id}/tool-calls/{tool_call_id}/result/"),
    ("post", "/api/v1/runs/{run_id}/events/"),
    ("post", "/api/v1/runs/{run_id}/outbox/"),
    ("post", "/api/v1/runs/{run_id}/drained/"),
    ("post", "/api/v1/runs/{run_id}/cancel/"),
    ("post", "/api/v1/runs/{run_id}/takeover/"),
    ("post", "/api/v1/runs/{run_id}/resume/"),
    ("post", "/api/v1/runs/{run_id}/close/"),
    ("get", "/api/v1/runs/{run_id}/stop-packet/"),
    ("get", "/api/v1/runs/{run_id}/stop-packets/{epoch}/"),
    ("post", "/api/v1/runs/{run_id}/resolutions/"),
    ("post", "/api/v1/runs/{run_id}/steering/"),
    ("get", "/api/v1/ledger/"),
    ("get", "/api/v1/metrics/stop-quality/"),
]


def test_the_schema_has_every_row_of_the_contract(client):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    for method, path in DESIGN_PATHS:
        assert method in document["paths"].get(path, {}), f"{method.upper()} {path} is missing"
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        **document["components"]["securitySchemes"]["bearerAuth"],
        "type": "http",
        "scheme": "bearer",
    }


def test_the_schema_validates_without_warnings(tmp_path):
    call_command(
        "spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml")
    )
    assert (tmp_path / "schema.yaml").read_text().startswith("openapi: 3")


def test_the_docs_page_uses_our_own_static_files(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "cdn" not in page.lower()
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")


POSITIVE_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
NEGATIVE_CHECKS = [not_a_server_error, content_type_conformance, response_schema_conformance]


@pytest.fixture
def wsgi_keeps_the_test_transaction():
    """A bare WSGIHandler closes "obsolete" connections after each request — in a test, that is
    the connection holding the test's transaction. Django's test client unhooks it the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.slow
@pytest.mark.usefixtures("wsgi_keeps_the_test_transaction")
def test_schemathesis_finds_no_5xx_and_no_undocumented_answer(
    team, reviewer_token, agent_token, settings
):
    """Every operation, positive and negative inputs, with valid tokens of both roles; path
    parameters are sometimes pointed at real runs so the calls get past the 404."""
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 0  # fuzzing is not abuse
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
    running, _ = make_running(team)
    stopped = make_run(team)
    stop(stopped)
    run_ids = st.sampled_from([running.pk, stopped.pk, None])
    tokens = st.sampled_from([reviewer_token, agent_token])
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= len(DESIGN_PATHS)
    for operation in operations:
        _exercise(operation, GenerationMode.POSITIVE, POSITIVE_CHECKS, 20, run_ids, tokens)
        _exercise(operation, GenerationMode.NEGATIVE, NEGATIVE_CHECKS, 10, run_ids, tokens)


def _exercise(operation, mode, checks, examples, run_ids, tokens) -> None:
    @given(case=operation.as_strategy(generation_mode=mode), run_id=run_ids, token=tokens)
    @hypothesis_settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def exercise(case, run_id, token):
        if run_id is not None and case.path_parameters and "run_id" in case.path_parameters:
            case.path_parameters["run_id"] = run_id
        response = case.call(headers={"Authorization": f"Bearer {token.raw}"})
        case.validate_response(response, checks=checks)

    exercise()
