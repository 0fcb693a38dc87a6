from __future__ import annotations

from django.apps import AppConfig


class RunsApiConfig(AppConfig):
    """The wire contract (DESIGN §5). An app of its own only for its abuse counters' tables,
    so its migrations never interleave with the `runs` app's."""

    name = "api"
    label = "runs_api"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "API guard"
