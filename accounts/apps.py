from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in
        from django.core.exceptions import ImproperlyConfigured
        from django.db.models.signals import post_delete, post_save

        from accounts import conf, services
        from runs.models import Membership, Team

        try:  # a mapping that does not parse stops the start, with the reason
            conf.group_roles_seed_rows()
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None

        # Every sign-in (password or OIDC) records its session key against the user, so a
        # deactivation can delete exactly that user's sessions instead of decoding every one.
        user_logged_in.connect(
            services.on_user_logged_in, dispatch_uid="safestop.accounts.session_recorded"
        )
        # The middleware reads each user's team time zone from the cache; these forget it when
        # it may have changed, so the next request shows the new zone (not the next sign-in).
        post_save.connect(
            services.on_team_saved, sender=Team, dispatch_uid="safestop.accounts.team_zone"
        )
        for signal in (post_save, post_delete):
            signal.connect(
                services.on_membership_changed,
                sender=Membership,
                dispatch_uid=f"safestop.accounts.membership_zone.{signal is post_save}",
            )
