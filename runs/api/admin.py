"""Admin: revoke API tokens; read the denied-attempt counters.

Tokens are created with `manage.py create_api_token` (the raw secret is shown once, there), so
the admin neither adds nor deletes them: it revokes, through the same service as everywhere
else, which ledgers who did it. If the `runs` app ever registers ApiToken itself, that wins.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from runs.actors import Actor
from runs.api.models import Denial
from runs.models import ApiToken
from runs.tokens import api_token_revoke


class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "role", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("role", "team", ("revoked_at", admin.EmptyFieldListFilter))
    search_fields = ("name", "prefix", "team__slug")
    readonly_fields = ("team", "name", "role", "prefix", "created_at", "last_used_at", "revoked_at")
    exclude = ("token_hash",)
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        actor = Actor.for_user(request.user)
        tokens = list(queryset.filter(revoked_at__isnull=True).values_list("pk", flat=True))
        for token_id in tokens:
            api_token_revoke(token_id=token_id, actor=actor)
        self.message_user(request, f"Revoked {len(tokens)} token(s).", messages.SUCCESS)


if not admin.site.is_registered(ApiToken):
    admin.site.register(ApiToken, ApiTokenAdmin)


@admin.register(Denial)
class DenialAdmin(admin.ModelAdmin):
    list_display = ("window_start", "reason", "team_slug", "credential", "client_ip", "route", "count", "last_at")
    list_filter = ("reason", "team_slug")
    search_fields = ("credential", "client_ip", "route")
    date_hierarchy = "window_start"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
