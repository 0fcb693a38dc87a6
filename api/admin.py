"""Admin: the denied-attempt counters, read-only (API tokens are revoked from `runs.admin`)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from api.models import Denial


@admin.register(Denial)
class DenialAdmin(admin.ModelAdmin):
    list_display = (
        "window_start",
        "reason",
        "team_slug",
        "credential",
        "client_ip",
        "route",
        "count",
        "last_at",
    )
    list_filter = ("reason", "team_slug")
    search_fields = ("credential", "client_ip", "route")
    date_hierarchy = "window_start"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
