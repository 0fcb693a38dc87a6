from __future__ import annotations

from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "policies"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # runs sits below policies and never imports it: it calls the checks registered here
        # inside its own transactions (runs/hooks.py), and runs our periodic tick in the
        # embedded background loop (Celery beat schedules `policies.tasks.tick` instead).
        from policies.evaluate import Checks
        from policies.periodic import policies_tick
        from runs import hooks

        hooks.register_policies(Checks())
        hooks.on_periodic("policies", policies_tick)
