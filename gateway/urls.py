"""`/api/v1/mcp/` (mounted by console/urls.py before api's catch-all)."""

from __future__ import annotations

from django.urls import path

from gateway import api

urlpatterns = [
    path("upstreams/", api.UpstreamsView.as_view(), name="mcp-upstreams"),
    path("upstreams/<str:upstream_id>/", api.UpstreamDetailView.as_view(), name="mcp-upstream"),
]
