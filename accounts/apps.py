from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in
        from django.core.exceptions import ImproperlyConfigured

        from accounts import conf, services

        try:  # a mapping that does not parse stops the start, with the reason
            conf.group_roles_seed_rows()
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None

        # Every sign-in (password or OIDC) records its session key against the user, so a
        # deactivation can delete exactly that user's sessions instead of decoding every one.
        user_logged_in.connect(
            services.on_user_logged_in, dispatch_uid="safestop.accounts.session_recorded"
        )
