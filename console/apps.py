from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Channels is wired to the domain's change notifications here, so domain code never
        # imports Channels (STYLE: domain code imports neither Celery nor Channels).
        from console import realtime
        from runs import notify

        notify.subscribe(realtime.publish)
