"""Who a person is at the organisation's identity provider, and what its groups mean here.

DESIGN §16: users are keyed by the issuer and the subject of their ID token, never by e-mail
(an IdP lets a person change their address, and two IdPs may both vouch for one address); an
admin-kept table turns IdP groups into team roles.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _

from runs.models import Role, Team


class IdentityLink(models.Model):
    """One account at one issuer: the `(iss, sub)` pair of its ID tokens → our user."""

    issuer = models.CharField(max_length=255, verbose_name=_("issuer"))
    subject = models.CharField(max_length=255, verbose_name=_("subject"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="identity_links",
        verbose_name=_("user"),
    )
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))
    last_login_at = models.DateTimeField(null=True, blank=True, verbose_name=_("last login at"))

    class Meta:
        verbose_name = _("identity link")
        verbose_name_plural = _("identity links")
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="identity_unique_iss_sub")
        ]

    def __str__(self) -> str:
        return f"{self.subject} @ {self.issuer} → {self.user_id}"


class GroupRoleSource(models.TextChoices):
    SETTINGS = "settings", "SAFESTOP_OIDC_GROUP_ROLES"
    ADMIN = "admin", "An admin"


class GroupRole(models.Model):
    """An IdP group's members hold `role` on `team`. Several rows may name one group (one per
    team); a person in several mapped groups holds, per team, the highest role they give."""

    group = models.CharField(max_length=255, verbose_name=_("group"))
    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="group_roles", verbose_name=_("team")
    )
    role = models.CharField(max_length=16, choices=Role.choices, verbose_name=_("role"))
    source = models.CharField(
        max_length=16,
        choices=GroupRoleSource.choices,
        default=GroupRoleSource.ADMIN,
        verbose_name=_("source"),
    )
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("group role")
        verbose_name_plural = _("group roles")
        ordering = ["group", "team__slug"]
        constraints = [
            models.UniqueConstraint(fields=["group", "team"], name="grouprole_unique_group_team")
        ]

    def __str__(self) -> str:
        return f"{self.group} → {self.team}:{self.role}"


class SignedInSession(models.Model):
    """A session a sign-in made, so deactivating its user can delete it at once (the session
    table itself has no user column: finding them otherwise means decoding every session)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="signed_in_sessions",
        verbose_name=_("user"),
    )
    session_key = models.CharField(max_length=40, unique=True, verbose_name=_("session key"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("signed-in session")
        verbose_name_plural = _("signed-in sessions")

    def __str__(self) -> str:
        return f"session of {self.user_id}"


class UserSettings(models.Model):
    """What one person chose for the console: its language (blank: the browser's)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="console_settings",
        verbose_name=_("user"),
    )
    language = models.CharField(
        max_length=16, blank=True, choices=settings.LANGUAGES, verbose_name=_("language")
    )
    updated_at = models.DateTimeField(auto_now=True, verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("user settings")
        verbose_name_plural = _("user settings")

    def __str__(self) -> str:
        return f"settings of {self.user_id}"
