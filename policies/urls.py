"""`/api/v1/policies/` (mounted by console/urls.py before api's catch-all)."""

from __future__ import annotations

from django.urls import path

from policies import api

urlpatterns = [
    path("", api.PoliciesView.as_view(), name="policies"),
    path("test/", api.PolicyTestView.as_view(), name="policies-test"),
    path("test/<int:test_id>/", api.PolicyTestDetailView.as_view(), name="policies-test-detail"),
    path("<int:policy_id>/", api.PolicyDetailView.as_view(), name="policy"),
]
