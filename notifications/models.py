"""Team notification channels, users' own email subscriptions, and the deliveries: a
transactional outbox of its own (DESIGN §11; docs/OPERATIONS.md, "Notifications").

A `Delivery` is written in the transaction of the ledger entry it is about, one per subscribed
channel (or subscription), and sent after commit by the background loop or Celery. The event
key names the event, not the attempt: a retried event or a second worker meets the unique
constraint and writes nothing.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.translation import gettext_lazy as _

from runs.models import Run, Team


class Event(models.TextChoices):
    APPROVAL_WAITING = "approval.waiting", _("An approval is waiting")
    APPROVAL_ESCALATED = "approval.escalated", _("An approval is still waiting (escalated)")
    APPROVAL_EXPIRED = "approval.expired", _("An approval expired")
    RUN_STOPPED_DIRTY = "run.stopped_dirty", _("A run stopped dirty")
    RUN_INTERRUPTED = "run.interrupted", _("A run was interrupted with calls in flight")
    HANDOFF_WAITING = "handoff.waiting", _("A handoff is waiting")
    DRAIN_DEADLINE_PASSED = "drain.deadline_passed", _("A drain deadline passed")
    LEDGER_BROKEN = "ledger.broken", _("The ledger chain is broken")
    # xgettext:no-python-format
    BUDGET_WARNING = "budget.warning", _("A team budget is 80 % spent")
    POLICY_STOPPED = "policy.stopped", _("A policy stopped a run")
    POLICY_NOTIFIED = "policy.notified", _("A policy matched (notify)")


ALL_EVENTS: list[str] = list(Event.values)
TEST_EVENT = "test"


class ChannelKind(models.TextChoices):
    WEBHOOK = "webhook", _("Signed webhook")
    SLACK = "slack", _("Slack (incoming webhook)")
    EMAIL = "email", _("Email")
    APPRISE = "apprise", _("Other (Apprise URL: Teams, Discord, Telegram, …)")


def _all_events() -> list[str]:
    return list(ALL_EVENTS)


class NotificationChannel(models.Model):
    """Where a team's events go. `secret` signs webhooks: shown once at creation, never again."""

    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="notification_channels", verbose_name=_("team")
    )
    name = models.CharField(max_length=120, verbose_name=_("name"))
    kind = models.CharField(max_length=12, choices=ChannelKind.choices, verbose_name=_("kind"))
    # A URL (webhook, Slack), an address (email) or an Apprise URL. Slack and Apprise targets
    # carry their service's token, so pages show them masked (`target_display`).
    target = models.CharField(max_length=1000, verbose_name=_("target"))
    secret = models.CharField(max_length=100, blank=True, verbose_name=_("secret"))
    events = models.JSONField(default=_all_events, blank=True, verbose_name=_("events"))
    # fnmatch pattern over the run's agent; blank means every agent.
    agent_glob = models.CharField(max_length=120, blank=True, verbose_name=_("agent glob"))
    enabled = models.BooleanField(default=True, verbose_name=_("enabled"))
    # The language its messages are written in (a channel is read by many people: its own).
    language = models.CharField(
        max_length=16, choices=settings.LANGUAGES, default="en", verbose_name=_("language")
    )
    created_by = models.CharField(max_length=150, blank=True, verbose_name=_("created by"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("notification channel")
        verbose_name_plural = _("notification channels")
        ordering = ["team_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="notify_channel_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def target_display(self) -> str:
        from notifications.transports import mask_target

        return mask_target(self.kind, self.target)


class UserSubscription(models.Model):
    """A person's own email subscription to events of one of their teams."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="notification_subscriptions",
        verbose_name=_("user"),
    )
    team = models.ForeignKey(
        Team, on_delete=models.CASCADE, related_name="user_subscriptions", verbose_name=_("team")
    )
    events = models.JSONField(default=list, blank=True, verbose_name=_("events"))
    agent_glob = models.CharField(max_length=120, blank=True, verbose_name=_("agent glob"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("user subscription")
        verbose_name_plural = _("user subscriptions")
        constraints = [
            models.UniqueConstraint(fields=["user", "team"], name="notify_subscription_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} on {self.team_id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # waiting for its first or next attempt (`next_attempt_at`)
    SENDING = "sending"  # claimed by a sender
    SENT = "sent"
    FAILED = "failed"  # refused for good, or out of attempts


class Delivery(models.Model):
    team = models.ForeignKey(
        Team,
        on_delete=models.CASCADE,
        related_name="notification_deliveries",
        verbose_name=_("team"),
    )
    channel = models.ForeignKey(
        NotificationChannel,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
        verbose_name=_("channel"),
    )
    subscription = models.ForeignKey(
        UserSubscription,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
        verbose_name=_("subscription"),
    )
    run = models.ForeignKey(
        Run,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
        verbose_name=_("run"),
    )
    event = models.CharField(max_length=40, verbose_name=_("event"))
    # Names the event, not the attempt (approval id, stop request, handoff, broken entry).
    event_key = models.CharField(max_length=200, verbose_name=_("event key"))
    # What to say (title, text, link, facts), fixed when the event happened.
    message = models.JSONField(default=dict, verbose_name=_("message"))
    status = models.CharField(
        max_length=8,
        choices=DeliveryStatus.choices,
        default=DeliveryStatus.PENDING,
        verbose_name=_("status"),
    )
    attempts = models.PositiveSmallIntegerField(default=0, verbose_name=_("attempts"))
    next_attempt_at = models.DateTimeField(verbose_name=_("next attempt at"))
    claimed_at = models.DateTimeField(null=True, blank=True, verbose_name=_("claimed at"))
    claimed_by = models.CharField(max_length=120, blank=True, verbose_name=_("claimed by"))
    sent_at = models.DateTimeField(null=True, blank=True, verbose_name=_("sent at"))
    response_status = models.PositiveSmallIntegerField(
        null=True, blank=True, verbose_name=_("response status")
    )
    # The first bytes of the target's answer (or of the error), for the deliveries page.
    response_excerpt = models.CharField(
        max_length=500, blank=True, verbose_name=_("response excerpt")
    )
    last_error = models.TextField(blank=True, verbose_name=_("last error"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("delivery")
        verbose_name_plural = _("deliveries")
        ordering = ["-created_at", "-id"]
        constraints = [
            # The dedup (DESIGN §11): one delivery per (event, channel) and (event, subscription).
            # Written with ON CONFLICT DO NOTHING, so a duplicate never aborts the event's
            # transaction.
            models.UniqueConstraint(
                fields=["event_key", "channel"],
                condition=Q(channel__isnull=False),
                name="delivery_unique_event_channel",
            ),
            models.UniqueConstraint(
                fields=["event_key", "subscription"],
                condition=Q(subscription__isnull=False),
                name="delivery_unique_event_subscription",
            ),
            models.CheckConstraint(
                condition=Q(channel__isnull=False, subscription__isnull=True)
                | Q(channel__isnull=True, subscription__isnull=False),
                name="delivery_one_destination",
            ),
        ]
        indexes = [
            # The claim's leftovers (`deliveries_claim_due`): pending, oldest due first.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending"),
                name="delivery_due_idx",
            ),
            # The fair claim (`deliveries_claim_due`): which teams have due rows, and each
            # team's oldest due rows.
            models.Index(
                fields=["team", "next_attempt_at"],
                condition=Q(status="pending"),
                name="delivery_team_due_idx",
            ),
            # The stuck-claim reaper: `deliveries_reap_stuck`.
            models.Index(
                fields=["claimed_at"],
                condition=Q(status="sending"),
                name="delivery_sending_idx",
            ),
            # The deliveries page: a team's newest first.
            models.Index(fields=["team", "-created_at"], name="delivery_team_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} {self.event} ({self.status})"

    @property
    def public_id(self) -> str:
        return f"ntf_{self.pk}"


class CapturedMail(models.Model):
    """A mail the capture email backend kept instead of sending (the demo's "Outbox of
    notifications"; `notifications.mail.CaptureEmailBackend`)."""

    from_email = models.CharField(max_length=254, verbose_name=_("from email"))
    to = models.JSONField(default=list, verbose_name=_("recipients"))
    subject = models.CharField(max_length=300, verbose_name=_("subject"))
    text = models.TextField(blank=True, verbose_name=_("text"))
    html = models.TextField(blank=True, verbose_name=_("HTML"))
    headers = models.JSONField(default=dict, blank=True, verbose_name=_("headers"))
    captured_at = models.DateTimeField(auto_now_add=True, verbose_name=_("captured at"))

    class Meta:
        verbose_name = _("captured mail")
        verbose_name_plural = _("captured mails")
        ordering = ["-captured_at", "-id"]

    def __str__(self) -> str:
        return f"{self.subject} → {', '.join(self.to)}"

    @property
    def sent_for_run(self) -> str:
        """The run whose agent sent this mail through its outbox ('' for a notification)."""
        return str((self.headers or {}).get("X-Safestop-Run", ""))


class SlackLink(models.Model):
    """A console user's Slack member id: Slack clicks by that member decide with this user's
    rights (and only theirs). Made only with proof that the user controls the member: a
    one-time code Slack showed that member alone (`SlackLinkCode`)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="slack_link",
        verbose_name=_("user"),
    )
    slack_user_id = models.CharField(max_length=32, unique=True, verbose_name=_("Slack user ID"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("Slack link")
        verbose_name_plural = _("Slack links")

    def __str__(self) -> str:
        return f"{self.slack_user_id} → {self.user_id}"


class SlackLinkCode(models.Model):
    """A one-time code given to one Slack member, in an ephemeral reply to a click Slack signed
    for that member: whoever types it on their console page controls that member. Stored hashed;
    it expires, and using it deletes it."""

    slack_user_id = models.CharField(
        max_length=32, unique=True, verbose_name=_("Slack user ID")
    )  # one live code per member
    code_hash = models.CharField(max_length=64, unique=True, verbose_name=_("code hash"))
    expires_at = models.DateTimeField(verbose_name=_("expires at"))
    created_at = models.DateTimeField(auto_now_add=True, verbose_name=_("created at"))

    class Meta:
        verbose_name = _("Slack link code")
        verbose_name_plural = _("Slack link codes")

    def __str__(self) -> str:
        return f"link code for {self.slack_user_id}"


class SlackRequestSeen(models.Model):
    """The signature of every Slack action request accepted in the last minutes: a replay of a
    correctly signed request meets the unique constraint and is refused."""

    signature = models.CharField(max_length=100, unique=True, verbose_name=_("signature"))
    seen_at = models.DateTimeField(auto_now_add=True, db_index=True, verbose_name=_("seen at"))

    class Meta:
        verbose_name = _("Slack request seen")
        verbose_name_plural = _("Slack requests seen")

    def __str__(self) -> str:
        return f"Slack request seen at {self.seen_at}"
