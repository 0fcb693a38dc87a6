"""The header's language switch: a signed-in user's choice is saved on the user (it follows
them to every browser and into their notifications); before sign-in it is a cookie."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext
from django.views.decorators.http import require_POST

from accounts.services import SESSION_LANGUAGE, user_language_set

LANGUAGE_CODES = frozenset(code for code, _name in settings.LANGUAGES)


def _back(request: HttpRequest) -> str:
    """Where the switch was pressed (same host only), else the runs page."""
    target = request.POST.get("next") or request.headers.get("Referer") or "/"
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return "/"
    return target


@require_POST
def language_set(request: HttpRequest) -> HttpResponse:
    language = request.POST.get("language", "")
    if language not in LANGUAGE_CODES:
        return HttpResponseBadRequest(
            gettext("Choose one of the console's languages."), content_type="text/plain"
        )
    if request.user.is_authenticated:
        user_language_set(user=request.user, language=language)
        request.session[SESSION_LANGUAGE] = language
    response = HttpResponseRedirect(_back(request))
    # The cookie keeps the choice on the sign-in page too, before the user is known.
    response.set_cookie(
        settings.LANGUAGE_COOKIE_NAME,
        language,
        max_age=settings.LANGUAGE_COOKIE_AGE or 365 * 24 * 3600,
        samesite="Lax",
        secure=settings.SESSION_COOKIE_SECURE,
        httponly=True,
    )
    return response
