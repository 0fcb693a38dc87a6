"""Abuse counters of the API: rate-limit windows and denied attempts.

Both are counters, not records of business state, and both are written with one atomic
`INSERT ... ON CONFLICT DO UPDATE SET n = n + 1 RETURNING n` (see `api.ratelimit`), so
concurrent requests can never lose an increment or let a burst slip past the limit.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class RateWindow(models.Model):
    """One fixed one-minute window of one caller (`token:<id>` / `user:<id>`).

    Used only when REDIS_URL is unset; with Redis the same counter is an INCR + EXPIRE key.
    """

    bucket = models.CharField(max_length=64, verbose_name=_("bucket"))
    window_start = models.BigIntegerField(
        help_text="unix time // window seconds", verbose_name=_("window start")
    )
    hits = models.PositiveIntegerField(default=0, verbose_name=_("hits"))

    class Meta:
        verbose_name = _("rate window")
        verbose_name_plural = _("rate windows")
        constraints = [
            # the ON CONFLICT target of the atomic increment
            models.UniqueConstraint(
                fields=["bucket", "window_start"], name="ratewindow_unique_bucket_window"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.bucket} @ {self.window_start}: {self.hits}"


class DenialReason(models.TextChoices):
    BAD_TOKEN = "bad_token", "Unknown, malformed or revoked token"
    WRONG_TEAM = "wrong_team", "Another team's run"
    WRONG_ROLE = "wrong_role", "Role may not do this"
    THROTTLED = "throttled", "Too many wrong tokens from the address"


class Denial(models.Model):
    """Denied attempts, counted per minute, reason, team, credential, client address and route.

    The key has only bounded parts (a route pattern, never the raw path; a known token's name,
    never attacker-chosen text), so a flood of bad requests grows a counter, not the table.
    """

    window_start = models.DateTimeField(verbose_name=_("window start"))
    reason = models.CharField(max_length=16, choices=DenialReason.choices, verbose_name=_("reason"))
    team_slug = models.CharField(max_length=64, blank=True, verbose_name=_("team slug"))
    credential = models.CharField(max_length=160, blank=True, verbose_name=_("credential"))
    client_ip = models.CharField(max_length=45, blank=True, verbose_name=_("client IP"))
    route = models.CharField(max_length=120, blank=True, verbose_name=_("route"))
    count = models.PositiveIntegerField(default=0, verbose_name=_("count"))
    first_at = models.DateTimeField(verbose_name=_("first at"))
    last_at = models.DateTimeField(verbose_name=_("last at"))
    last_detail = models.CharField(max_length=300, blank=True, verbose_name=_("last detail"))

    class Meta:
        verbose_name = _("denial")
        verbose_name_plural = _("denials")
        constraints = [
            models.UniqueConstraint(
                fields=["window_start", "reason", "team_slug", "credential", "client_ip", "route"],
                name="denial_unique_window_key",
            ),
        ]
        indexes = [
            # GET /api/v1/security/denials/: newest first, optionally per team
            models.Index(fields=["-last_at"], name="denial_last_at_idx"),
            models.Index(fields=["team_slug", "-last_at"], name="denial_team_last_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.reason} x{self.count} ({self.credential or 'anonymous'}, {self.window_start:%Y-%m-%d %H:%M})"
