from __future__ import annotations

from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Channels is wired to the domain's change notifications here, so domain code never
        # imports Channels: a transition must not wait on a socket or a broker, so services publish
        # through `runs.notify` and the listeners send after commit (docs/ARCHITECTURE.md, Layers).
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_out
        from django.db.models.signals import post_delete, post_save

        from console import celery, realtime
        from runs import notify
        from runs.models import Membership

        # `runs.tasks` are shared tasks: they send through the current Celery app, which is
        # per thread unless a default is set — and the dispatch kick sends from a daemon thread.
        celery.app.set_default()
        notify.subscribe(realtime.publish)
        # Access changes reach the user's open browser sockets (console/consumers.py re-checks).
        post_save.connect(
            realtime.on_membership_saved,
            sender=Membership,
            dispatch_uid="safestop.membership.saved",
        )
        post_delete.connect(
            realtime.on_membership_saved,
            sender=Membership,
            dispatch_uid="safestop.membership.deleted",
        )
        post_save.connect(
            realtime.on_user_saved, sender=get_user_model(), dispatch_uid="safestop.user.saved"
        )
        # So does the end of a session: the sockets of a logged-out session close (4401), not
        # only at the next timed re-check. A password change is a user save (above).
        user_logged_out.connect(
            realtime.on_user_logged_out, dispatch_uid="safestop.user.logged_out"
        )
