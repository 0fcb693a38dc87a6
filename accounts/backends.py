"""Password sign-in: for development and break glass (DESIGN §16)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend

from accounts import conf


class PasswordBackend(ModelBackend):
    """Django's password check; with `SAFESTOP_PASSWORD_LOGIN=off`, for superusers only.

    `user_can_authenticate` is asked both at sign-in and for every request of a session this
    backend made, so turning password sign-in off also ends the password sessions of everyone
    else. A refused password counts as a failed attempt: django-axes throttles it as any other.
    """

    def user_can_authenticate(self, user: Any) -> bool:
        return super().user_can_authenticate(user) and (
            conf.password_login_for_everyone() or bool(getattr(user, "is_superuser", False))
        )
