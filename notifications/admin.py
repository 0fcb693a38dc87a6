from __future__ import annotations

from django.contrib import admin

from notifications.models import (
    CapturedMail,
    Delivery,
    NotificationChannel,
    SlackLink,
    SlackLinkCode,
    SlackRequestSeen,
    UserSubscription,
)


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "kind", "target_display", "enabled", "created_at")
    list_filter = ("kind", "enabled", "team")
    search_fields = ("name",)
    # The signing secret is shown once, by the console page that creates the channel; the
    # admin never shows it. Slack and Apprise targets carry a token: shown masked, not edited
    # here (the console's channel form replaces them).
    exclude = ("secret",)
    readonly_fields = ("target_display", "created_by", "created_at")

    def get_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        fields = list(super().get_fields(request, obj))
        if obj is not None and obj.kind in ("slack", "apprise", "webhook"):
            fields.remove("target")
        return fields


@admin.register(UserSubscription)
class UserSubscriptionAdmin(admin.ModelAdmin):
    list_display = ("user", "team", "events", "agent_glob", "created_at")
    list_filter = ("team",)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("public_id", "event", "team", "channel", "status", "attempts", "created_at")
    list_filter = ("status", "event", "team")
    search_fields = ("event_key",)
    readonly_fields = [field.name for field in Delivery._meta.fields]

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(CapturedMail)
class CapturedMailAdmin(admin.ModelAdmin):
    list_display = ("subject", "to", "captured_at")
    readonly_fields = ("from_email", "to", "subject", "text", "html", "headers", "captured_at")


@admin.register(SlackLink)
class SlackLinkAdmin(admin.ModelAdmin):
    """Staff may unlink (delete); a link is only ever made by its owner with a code Slack gave
    them (`notifications.slack.slack_link_confirm`), never typed in here."""

    list_display = ("slack_user_id", "user", "created_at")
    search_fields = ("slack_user_id", "user__username")
    readonly_fields = ("user", "slack_user_id", "created_at")

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(SlackLinkCode)
class SlackLinkCodeAdmin(admin.ModelAdmin):
    list_display = ("slack_user_id", "expires_at", "created_at")
    readonly_fields = ("slack_user_id", "expires_at", "created_at")
    exclude = ("code_hash",)

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(SlackRequestSeen)
class SlackRequestSeenAdmin(admin.ModelAdmin):
    list_display = ("seen_at",)
    readonly_fields = ("signature", "seen_at")
