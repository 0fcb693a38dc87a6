"""The demo's notification channels (`manage.py demo_setup`): one mail channel per demo team.

With no SMTP host configured the mail is captured, not sent, and shown on the console's
"Outbox of notifications" page (`notifications.mail.CaptureEmailBackend`), so a new user sees
what a dirty stop or a waiting approval would have told the team.
"""

from __future__ import annotations

from console.demo.words import spellings, words
from notifications.models import ChannelKind, NotificationChannel
from notifications.services import channel_create
from runs.actors import Actor
from runs.models import Team

DEMO_CHANNEL = "Demo mailbox"


def demo_channels_ensure(team_slugs: list[str], *, language: str = "en") -> int:
    """Create the demo mail channel of each team that lacks one (under its name in any demo
    language); its name is in `language` (`console.demo.words`). Returns how many were made."""
    made = 0
    for team in Team.objects.filter(slug__in=team_slugs):
        if NotificationChannel.objects.filter(team=team, name__in=spellings(DEMO_CHANNEL)).exists():
            continue
        channel_create(
            team=team,
            name=words(language, DEMO_CHANNEL),
            # the team reads its mail in the demo's language (a channel's own, DESIGN §17)
            language=language,
            kind=ChannelKind.EMAIL,
            target=f"{team.slug}-oncall@example.com",
            actor=Actor.system("demo_setup"),
        )
        made += 1
    return made
