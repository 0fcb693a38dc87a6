"""The demo's notification channels (`manage.py demo_setup`): one mail channel per demo team.

With no SMTP host configured the mail is captured, not sent, and shown on the console's
"Outbox of notifications" page (`notifications.mail.CaptureEmailBackend`), so a new user sees
what a dirty stop or a waiting approval would have told the team.
"""

from __future__ import annotations

from notifications.models import ChannelKind, NotificationChannel
from notifications.services import channel_create
from runs.actors import Actor
from runs.models import Team

DEMO_CHANNEL = "Demo mailbox"


def demo_channels_ensure(
    team_slugs: list[str],
    *,
    name: str = DEMO_CHANNEL,
    also_named: tuple[str, ...] = (),
    language: str = "en",
) -> int:
    """Create the demo mail channel of each team that has none named `name` (or one of
    `also_named`: its name in the demo's other languages); `demo_setup` passes the name and the
    language of its messages in the demo's language. Returns how many were made."""
    made = 0
    for team in Team.objects.filter(slug__in=team_slugs):
        names = {name, *also_named}
        if NotificationChannel.objects.filter(team=team, name__in=names).exists():
            continue
        channel_create(
            team=team,
            name=name,
            # the team reads its mail in the demo's language (a channel's own, DESIGN §17)
            language=language,
            kind=ChannelKind.EMAIL,
            target=f"{team.slug}-oncall@example.com",
            actor=Actor.system("demo_setup"),
        )
        made += 1
    return made
