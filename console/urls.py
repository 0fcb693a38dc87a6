from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularSwaggerSplitView

from api.errors import json_not_found
from console.api_schema import CachedSchemaView

# The schema and its viewer answer GET only (the viewer has no template for anything else).
_READ_ONLY = ["get", "head"]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", CachedSchemaView.as_view(http_method_names=_READ_ONLY), name="api-schema"),
    path(
        "api/docs/",
        # The split view serves its script as a file (`?script`), and our template its style
        # (console/api_docs.html): the CSP allows neither inline.
        SpectacularSwaggerSplitView.as_view(
            url_name="api-schema",
            template_name="console/api_docs.html",
            http_method_names=_READ_ONLY,
        ),
        name="api-docs",
    ),
    # before api, whose last pattern answers a JSON 404 for anything else under /api/v1/
    path("api/v1/mcp/", include("gateway.urls")),
    path("api/v1/policies/", include("policies.urls")),
    path("api/v1/", include("api.urls")),
    re_path(r"^api/", json_not_found),  # /api/, /api/v2/...: JSON too
    path(
        "metrics", include("console.metrics")
    ),  # Prometheus text; urlpatterns live in console.metrics
    # /login/sso/ (the IdP's code flow) and /scim/v2/ (its provisioning): accounts/urls.py
    path("", include("accounts.urls")),
    path("", include("console.ui_urls")),
]
