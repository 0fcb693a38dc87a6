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

    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="mcp_upstreams", verbose_name=_("team")
    )
    name = models.SlugField(max_length=64, verbose_name=_("name"))
    transport = models.CharField(
        max_length=8, choices=Transport.choices, verbose_name=_("transport")
    )
    command = models.CharField(max_length=500, blank=True, verbose_name=_("command"))
    args = models.JSONField(default=list, blank=True, verbose_name=_("command arguments"))
    env_names = models.JSONField(
        default=list, blank=True, verbose_name=_("environment variable names")
    )
    env_sealed = models.TextField(blank=True, verbose_name=_("environment (sealed)"))
    url = models.URLField(max_length=500, blank=True, verbose_name=_("URL"))
    header_names = models.JSONField(default=list, blank=True, verbose_name=_("header names"))
    headers_sealed = models.TextField(blank=True, verbose_name=_("headers (sealed)"))
    enabled = models.BooleanField(default=True, verbose_name=_("enabled"))
    created_by = models.CharField(max_length=150, blank=True, verbose_name=_("created by"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("MCP upstream")
        verbose_name_plural = _("MCP upstreams")
        ordering = ["team", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="mcpupstream_unique_team_name")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.team.slug})"


class McpSession(models.Model):
    """One MCP session through the gateway: which client, which upstream, which run."""

    public_id = models.CharField(max_length=64, unique=True, verbose_name=_("public ID"))
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="mcp_sessions", verbose_name=_("run")
    )
    upstream = models.ForeignKey(
        McpUpstream,
        on_delete=models.SET_NULL,
        null=True,
        related_name="sessions",
        verbose_name=_("upstream"),
    )
    upstream_name = models.CharField(max_length=64, verbose_name=_("upstream name"))
    client_name = models.CharField(max_length=200, blank=True, verbose_name=_("client name"))
    client_version = models.CharField(max_length=100, blank=True, verbose_name=_("client version"))
    token_name = models.CharField(max_length=150, blank=True, verbose_name=_("token name"))
    started_at = models.DateTimeField(auto_now_add=True, verbose_name=_("started at"))
    ended_at = models.DateTimeField(null=True, blank=True, verbose_name=_("ended at"))
    end_reason = models.CharField(max_length=64, blank=True, verbose_name=_("end reason"))

    class Meta:
        verbose_name = _("MCP session")
        verbose_name_plural = _("MCP sessions")
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"{self.client_name or 'MCP client'} → {self.upstream_name} ({self.run_id})"
