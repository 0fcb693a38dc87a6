"""Upstream MCP servers a team registered, and the gateway sessions opened on them."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.models import Run, Team


class Transport(models.TextChoices):
    STDIO = "stdio", _("stdio command")
    HTTP = "http", _("streamable HTTP")


class McpUpstream(models.Model):
    """One upstream MCP server, reached at `/mcp/<name>/` by the team's agent tokens.

    `env_sealed` / `headers_sealed` hold the secrets encrypted (`gateway.secrets`); the API
    and the admin show their names only, never the values.
    """

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="mcp_upstreams")
    name = models.SlugField(max_length=64)
    transport = models.CharField(max_length=8, choices=Transport.choices)
    command = models.CharField(max_length=500, blank=True)
    args = models.JSONField(default=list, blank=True)
    env_names = models.JSONField(default=list, blank=True)
    env_sealed = models.TextField(blank=True)
    url = models.URLField(max_length=500, blank=True)
    header_names = models.JSONField(default=list, blank=True)
    headers_sealed = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["team", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="mcpupstream_unique_team_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.team.slug})"


class McpSession(models.Model):
    """One MCP session through the gateway: which client, which upstream, which run."""

    public_id = models.CharField(max_length=64, unique=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="mcp_sessions")
    upstream = models.ForeignKey(
        McpUpstream, on_delete=models.SET_NULL, null=True, related_name="sessions"
    )
    upstream_name = models.CharField(max_length=64)
    client_name = models.CharField(max_length=200, blank=True)
    client_version = models.CharField(max_length=100, blank=True)
    token_name = models.CharField(max_length=150, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"{self.client_name or 'MCP client'} → {self.upstream_name} ({self.run_id})"
