from __future__ import annotations

from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "policies"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # runs sits below policies and never imports it: it calls the checks registered here
        # inside its own transactions (runs/hooks.py), and runs our periodic tick with its own
        # periodic work (the embedded loop, or Celery's `wake`), woken each second only while a
        # time rule has a running run to look at.
        from policies.evaluate import Checks
        from policies.periodic import next_time_rule_deadline, policies_tick
        from runs import hooks

        hooks.register_policies(Checks())
        hooks.on_periodic("policies", policies_tick)
        hooks.on_deadline("policies", next_time_rule_deadline)
