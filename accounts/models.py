"""Who a person is at the organisation's identity provider, and what its groups mean here.

DESIGN §16: users are keyed by the issuer and the subject of their ID token, never by e-mail
(an IdP lets a person change their address, and two IdPs may both vouch for one address); an
admin-kept table turns IdP groups into team roles.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.models import Role, Team


class IdentityLink(models.Model):
    """One account at one issuer: the `(iss, sub)` pair of its ID tokens → our user."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identity_links"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
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

    group = models.CharField(max_length=255)
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="group_roles")
    role = models.CharField(max_length=16, choices=Role.choices)
    source = models.CharField(
        max_length=16, choices=GroupRoleSource.choices, default=GroupRoleSource.ADMIN
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
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
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="signed_in_sessions"
    )
    session_key = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"session of {self.user_id}"


class UserSettings(models.Model):
    """What one person chose for the console: its language (blank: the browser's)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="console_settings"
    )
    language = models.CharField(max_length=16, blank=True, choices=settings.LANGUAGES)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"settings of {self.user_id}"
