from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    label = "gateway"
    verbose_name = "MCP gateway"
    default_auto_field = "django.db.models.BigAutoField"
