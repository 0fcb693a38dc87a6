"""OpenAPI 3 at /api/schema/, Swagger UI at /api/docs/ from our own static files. Schemathesis
against the schema, with every check, runs against a live server: test_schema_live.py."""

from __future__ import annotations

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command

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
