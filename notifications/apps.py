from __future__ import annotations

from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # runs tells us of every ledger entry inside its transaction, and runs our periodic
        # step in the embedded background loop, without importing notifications (runs/hooks.py).
        from notifications.events import WATCHED_ACTIONS
        from notifications.periodic import notifications_periodic
        from notifications.services import deliveries_enqueue_for_entry, deliveries_next_due
        from runs import hooks

        hooks.on_entry_appended(deliveries_enqueue_for_entry, actions=WATCHED_ACTIONS)
        hooks.on_periodic("notifications", notifications_periodic)
        hooks.on_deadline("notifications", deliveries_next_due)
