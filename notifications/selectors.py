"""Read queries of the notification pages."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import QuerySet

from notifications.models import (
    CapturedMail,
    Delivery,
    NotificationChannel,
    SlackLink,
    UserSubscription,
)
from runs.models import Membership, Team


def channels_of(*, teams: Sequence[Team]) -> list[NotificationChannel]:
    return list(
        NotificationChannel.objects.filter(team__in=teams)
        .select_related("team")
        .order_by("team__slug", "name")
    )


def channel_get(*, channel_id: int) -> NotificationChannel | None:
    return NotificationChannel.objects.select_related("team").filter(pk=channel_id).first()


def deliveries_of(*, teams: Sequence[Team], status: str = "", limit: int = 200) -> list[Delivery]:
    """The newest deliveries of these teams (`delivery_team_created_idx`)."""
    rows: QuerySet[Delivery] = Delivery.objects.filter(team__in=teams)
    if status:
        rows = rows.filter(status=status)
    return list(
        rows.select_related("team", "channel", "subscription__user").order_by("-created_at", "-id")[
            :limit
        ]
    )


def subscriptions_of(*, user_id: int) -> dict[int, UserSubscription]:
    return {sub.team_id: sub for sub in UserSubscription.objects.filter(user_id=user_id)}


def captured_mails(*, limit: int = 100) -> list[CapturedMail]:
    return list(CapturedMail.objects.order_by("-captured_at", "-id")[:limit])


def captured_mails_by_sender(*, limit: int = 100) -> tuple[list[CapturedMail], list[CapturedMail]]:
    """The captured mail in two lists: safestop's own notifications, and the e-mails agents sent
    through their runs' outboxes (`X-Safestop-Run`, runs/transports.py) — customers' mail is not
    a notification to the team."""
    newest = CapturedMail.objects.order_by("-captured_at", "-id")
    agents = newest.filter(headers__has_key="X-Safestop-Run")
    return list(newest.exclude(headers__has_key="X-Safestop-Run")[:limit]), list(agents[:limit])


def slack_links_of(*, teams: Sequence[Team], limit: int = 500) -> list[SlackLink]:
    """The Slack links of these teams' members (for their admins, who may unlink them)."""
    members = Membership.objects.filter(team__in=teams).values("user_id")
    return list(
        SlackLink.objects.filter(user_id__in=members)
        .select_related("user")
        .order_by("user__username")[:limit]
    )


def slack_link_of(*, user_id: int) -> SlackLink | None:
    return SlackLink.objects.filter(user_id=user_id).first()
