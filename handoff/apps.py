from __future__ import annotations

from django.apps import AppConfig


class HandoffConfig(AppConfig):
    name = "handoff"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # runs calls these inside its own transitions (runs/hooks.py), without importing handoff.
        from handoff.packets import stop_packet_for_settled_run
        from handoff.services import handoff_open_for_takeover, handoffs_end_open
        from runs import hooks

        hooks.register(
            hooks.Hooks(
                stop_settled=stop_packet_for_settled_run,
                hand_off=handoff_open_for_takeover,
                handoffs_end=handoffs_end_open,
            )
        )
