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
    ("get", "/api/v1/approval-rules/"),
    ("post", "/api/v1/approval-rules/"),
    ("get", "/api/v1/approval-rules/{rule_id}/"),
    ("patch", "/api/v1/approval-rules/{rule_id}/"),
    ("delete", "/api/v1/approval-rules/{rule_id}/"),
    ("get", "/api/v1/policies/"),
    ("post", "/api/v1/policies/"),
    ("get", "/api/v1/policies/{policy_id}/"),
    ("patch", "/api/v1/policies/{policy_id}/"),
    ("delete", "/api/v1/policies/{policy_id}/"),
    ("post", "/api/v1/policies/test/"),
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


def test_the_permit_409_names_tool_call_conflict_and_the_first_call(client):
    document = client.get("/api/schema/?format=json").json()
    operation = document["paths"]["/api/v1/runs/{run_id}/permits/"]["post"]
    assert "tool_call_conflict" in operation["description"]
    conflict = operation["responses"]["409"]
    assert "tool_call_conflict" in conflict["description"]
    name = conflict["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    properties = document["components"]["schemas"][name]["properties"]
    assert {"error", "tool_call_id", "first_tool", "first_arguments"} <= properties.keys()


def test_a_run_s_detail_has_its_result_and_rule_bodies_are_closed(client):
    document = client.get("/api/schema/?format=json").json()
    detail = document["paths"]["/api/v1/runs/{run_id}/"]["get"]["responses"]["200"]
    name = detail["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert {"result", "failure"} <= document["components"]["schemas"][name]["properties"].keys()
    create = document["paths"]["/api/v1/approval-rules/"]["post"]["requestBody"]
    name = create["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    assert document["components"]["schemas"][name]["additionalProperties"] is False


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


def test_the_schema_is_generated_once_per_language_and_is_the_generators_own(client, monkeypatch):
    from drf_spectacular.generators import SchemaGenerator

    from console import api_schema

    api_schema._schema.cache_clear()
    generated: list[str | None] = []
    real = SchemaGenerator.get_schema

    def counted(self, *args, **kwargs):
        from django.utils import translation

        generated.append(translation.get_language())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SchemaGenerator, "get_schema", counted)
    first = client.get("/api/schema/?format=json")
    again = client.get("/api/schema/?format=json")
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert len(generated) == 1
    assert first.json() == SchemaGenerator().get_schema(request=None, public=True)
    # another language is another document (descriptions may be translated)
    assert client.get("/api/schema/?format=json&lang=zh-hans").status_code == 200
    assert generated[-1] == "zh-hans"
    assert len(generated) == 3  # the cached one, zh-hans, and the comparison above
    client.get("/api/schema/?format=json&lang=zh-hans")
    # a language nobody speaks, or a version the API does not have, is the same document
    for query in ("lang=" + "x" * 500, "lang=%00", "version=" + "9" * 40):
        assert client.get(f"/api/schema/?format=json&{query}").json() == first.json()
    assert len(generated) == 3
    api_schema._schema.cache_clear()
