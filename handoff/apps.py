from __future__ import annotations

from django.apps import AppConfig


class HandoffConfig(AppConfig):
    name = "handoff"
    default_auto_field = "django.db.models.BigAutoField"
