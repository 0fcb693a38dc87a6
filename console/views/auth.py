"""Signing in: the login page (the organisation's IdP when configured, passwords for development
and break glass) and what it answers once django-axes has locked a user or an address."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from axes.helpers import get_cool_off
from axes.models import AccessFailureLog
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from accounts import conf
from api.ratelimit import client_address

# Lockouts further back than this no longer lengthen the next one.
LOCKOUT_MEMORY = timedelta(hours=24)


def login_cool_off(request: HttpRequest | None = None) -> timedelta:
    """`AXES_COOLOFF_TIME`: how long one (username, address) pair stays locked. It doubles with
    each lockout of the same pair within a day (since that user's last successful sign-in):
    SAFESTOP_LOGIN_COOLOFF_SECONDS, twice that, four times, … up to
    SAFESTOP_LOGIN_COOLOFF_MAX_SECONDS. A person who mistyped waits minutes; a guesser who keeps
    going waits hours, and only at their own address."""
    base = timedelta(seconds=settings.SAFESTOP_LOGIN_COOLOFF_SECONDS)
    ceiling = timedelta(seconds=settings.SAFESTOP_LOGIN_COOLOFF_MAX_SECONDS)
    username = request.POST.get("username", "") if request is not None else ""
    # Axes asks this on every sign-in *and* sign-out, with whatever the form carried: a name no
    # user can have (a NUL, past the column) is never looked up (PostgreSQL refuses a NUL).
    if not username or request is None or "\x00" in username or len(username) > 150:
        return base
    address = getattr(request, "axes_ip_address", None) or client_address(request)
    since = timezone.now() - LOCKOUT_MEMORY
    last_login = (
        get_user_model()
        .objects.filter(username=username)
        .values_list("last_login", flat=True)
        .first()
    )
    if last_login is not None and last_login > since:
        since = last_login
    failures = AccessFailureLog.objects.filter(
        username=username, ip_address=address, attempt_time__gte=since
    ).count()
    # Attempts made while locked count as failures too: hammering a locked pair lengthens it.
    lockouts = max(1, failures // settings.AXES_FAILURE_LIMIT)
    return min(base * 2 ** min(lockouts - 1, 30), ceiling)


def sign_in_choices() -> dict[str, Any]:
    """What the login page offers: the IdP's button when one is configured, and whether the
    password form is for everyone or only for superusers (break glass)."""
    return {
        "sso_provider": conf.provider_name() if conf.sso_enabled() else "",
        "password_for_everyone": conf.password_login_for_everyone(),
    }


class LoginPage(LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), **sign_in_choices()}


def login_locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict[str, Any] | None = None,
) -> HttpResponse:
    """`AXES_LOCKOUT_CALLABLE`: the login page again, saying why and for how long, as a 429
    with `Retry-After`. The same answer whether the password was right or not, so a locked
    attempt tells a guesser nothing."""
    cool_off = get_cool_off(request)
    seconds = max(1, math.ceil(cool_off.total_seconds())) if cool_off else None
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    form = AuthenticationForm(request, initial={"username": username})
    response = render(
        request,
        "registration/login.html",
        {
            "form": form,
            "locked_out": True,
            "retry_minutes": math.ceil(seconds / 60) if seconds else None,
            "next": request.POST.get("next", ""),
            **sign_in_choices(),
        },
        status=429,
    )
    if seconds:
        response["Retry-After"] = str(seconds)
    return response
