from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from runs import checks  # noqa: F401  (registers the system checks)

        if settings.REDIS_URL:
            # With Celery, an enqueue kicks a dispatch task on commit. Wired here, not in the
            # services, so domain code never imports Celery.
            from runs.tasks import install_dispatch_kick

            install_dispatch_kick()
