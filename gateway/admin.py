"""The Django admin's view of upstreams: secrets are never shown (their names only)."""

from __future__ import annotations

from django.contrib import admin

from gateway.models import McpSession, McpUpstream


@admin.register(McpUpstream)
class McpUpstreamAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "transport", "command", "url", "enabled", "created_at")
    list_filter = ("transport", "enabled", "team")
    # Registering goes through the API or the console (`gateway.services.upstream_create`
    # validates, seals the secrets and writes the ledger entry); the admin may only
    # enable, disable or delete.
    readonly_fields = (
        "team",
        "name",
        "transport",
        "command",
        "args",
        "env_names",
        "url",
        "header_names",
        "created_by",
        "created_at",
    )
    exclude = ("env_sealed", "headers_sealed")

    def has_add_permission(self, request: object) -> bool:
        return False


@admin.register(McpSession)
class McpSessionAdmin(admin.ModelAdmin):
    list_display = ("public_id", "run", "upstream_name", "client_name", "started_at", "end_reason")
    readonly_fields = [f.name for f in McpSession._meta.fields]

    def has_add_permission(self, request: object) -> bool:
        return False
