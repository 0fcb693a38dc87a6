"""Signing in: what the login page answers once django-axes has locked a user or an address."""

from __future__ import annotations

import math
from typing import Any

from axes.helpers import get_cool_off
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


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
        },
        status=429,
    )
    if seconds:
        response["Retry-After"] = str(seconds)
    return response
