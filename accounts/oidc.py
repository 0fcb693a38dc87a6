"""OpenID Connect sign-in through mozilla-django-oidc, with what it leaves to its user.

The library does the authorization code flow: state (one per attempt, kept in the session and
deleted when used, so a callback is good once), nonce (checked against the ID token), PKCE S256
(`OIDC_USE_PKCE`), the signature check against the IdP's JWKS, and the session re-check
(`SessionRefresh`). This module adds:

- the endpoints from the issuer's discovery document (`.well-known/openid-configuration`),
  fetched when first needed and cached, and refused when the document names another issuer;
- the ID token's audience, issuer, expiry and `azp` checked (the library checks none of them);
  RFC 9207's `iss` on the authorization response checked when the IdP sends it;
- users keyed by (issuer, subject) and the group roles applied (`accounts.services.sign_in`);
- every refusal — wrong audience, a replayed or expired code, a state the session never issued,
  an issuer mix-up, a groups claim that is not a list, an unreachable IdP — logged as one line
  (`sso.refused reason=...`) and answered with a page that says what happened, never a 500.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
import requests
from django.conf import settings
from django.contrib import auth
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_POST
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.middleware import SessionRefresh as LibrarySessionRefresh
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from accounts import conf
from accounts.services import SignInRefused, sign_in

logger = logging.getLogger("safestop.sso")

DISCOVERY_TTL_SECONDS = 3600.0


class DiscoveryError(Exception):
    """No usable discovery document: `code` is `idp_unreachable`, or `issuer_mismatch` when the
    document names another issuer."""

    def __init__(self, detail: str, code: str = "idp_unreachable") -> None:
        super().__init__(detail)
        self.code = code


_discovery_cache: dict[str, tuple[float, dict[str, Any]]] = {}
_discovery_lock = threading.Lock()


def discovery() -> dict[str, Any]:
    """The configured issuer's discovery document (cached an hour per process).

    Its `issuer` must be the configured one: a document naming another issuer is the
    mix-up the spec's check exists for (OpenID Connect Discovery §4.3)."""
    issuer = conf.issuer()
    now = time.monotonic()
    with _discovery_lock:
        hit = _discovery_cache.get(issuer)
        if hit is not None and hit[0] > now:
            return hit[1]
    url = f"{issuer}/.well-known/openid-configuration"
    try:
        response = httpx.get(url, timeout=float(getattr(settings, "OIDC_TIMEOUT", 10) or 10))
        response.raise_for_status()
        document = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise DiscoveryError(f"{url}: {exc}") from None
    if not isinstance(document, dict):
        raise DiscoveryError(f"{url}: not a JSON object")
    if str(document.get("issuer", "")).rstrip("/") != issuer:
        raise DiscoveryError(
            f"{url} names issuer {document.get('issuer')!r}, not {issuer!r}", "issuer_mismatch"
        )
    for key in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        if not isinstance(document.get(key), str):
            raise DiscoveryError(f"{url} has no {key}")
    with _discovery_lock:
        _discovery_cache[issuer] = (now + DISCOVERY_TTL_SECONDS, document)
    return document


def discovery_forget() -> None:
    with _discovery_lock:
        _discovery_cache.clear()


def oidc_setting(attr: str, *default: Any) -> Any:
    """The library's settings, from ours: the client from `SAFESTOP_OIDC_*`, the rest as set in
    console/settings.py. Endpoints are never read through here (they come from discovery, set
    on the instance just before use), so nothing reaches the network while Django loads the
    authentication backends for a password sign-in."""
    if attr == "OIDC_RP_CLIENT_ID":
        return conf.client_id()
    if attr == "OIDC_RP_CLIENT_SECRET":
        return conf.client_secret()
    return import_from_settings(attr, *default)


def _refuse(request: HttpRequest, code: str, detail: str = "") -> None:
    """One log line per refused sign-in, and the reason kept for the page."""
    logger.warning("sso.refused reason=%s detail=%s", code, detail.replace("\n", " ")[:300])
    request.safestop_sso_refusal = code  # type: ignore[attr-defined]


def is_idp_sign_in(request: HttpRequest, credentials: dict[str, Any] | None = None) -> bool:
    """`AXES_WHITELIST_CALLABLE`: the IdP's callback is not a password guess. The IdP throttles
    its own sign-in; counting our refusals (no mapped group, a stale link) against the address
    would lock a whole office's password sign-in after five of them."""
    return bool(credentials and "nonce" in credentials)


class OIDCBackend(OIDCAuthenticationBackend):
    """Signs in the person the IdP vouches for, as the (issuer, subject) link's user."""

    get_settings = staticmethod(oidc_setting)  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's: it reads the endpoints here, which would fetch the discovery
        # document whenever Django loads the backends (every password sign-in too).
        self.UserModel = get_user_model()
        self.issuer = ""

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        # Only the callback view calls with a nonce; a password sign-in passes through here too.
        if request is None or "nonce" not in kwargs or not conf.sso_enabled():
            return None
        try:
            document = discovery()
            self.issuer = str(document["issuer"])
            self.OIDC_OP_TOKEN_ENDPOINT = document["token_endpoint"]
            self.OIDC_OP_USER_ENDPOINT = document.get("userinfo_endpoint") or ""
            self.OIDC_OP_JWKS_ENDPOINT = document["jwks_uri"]
            self.OIDC_RP_CLIENT_ID = conf.client_id()
            self.OIDC_RP_CLIENT_SECRET = conf.client_secret()
            self.OIDC_RP_SIGN_ALGO = str(getattr(settings, "OIDC_RP_SIGN_ALGO", "RS256"))
            self.OIDC_RP_IDP_SIGN_KEY = None
            # RFC 9207: an IdP that names itself on the redirect must name the one we asked.
            named = request.GET.get("iss")
            if named is not None and named.rstrip("/") != self.issuer.rstrip("/"):
                raise SignInRefused("issuer_mismatch", f"the redirect names issuer {named!r}")
            return super().authenticate(request, **kwargs)
        except SignInRefused as exc:
            _refuse(request, exc.code, exc.detail)
        except DiscoveryError as exc:
            _refuse(request, exc.code, str(exc))
        except requests.HTTPError as exc:
            # The token endpoint refused the code: expired, replayed, or not issued to us.
            response = exc.response
            body = response.text[:200] if response is not None else ""
            _refuse(request, "code_refused", f"token endpoint answered {body}")
        except requests.RequestException as exc:
            _refuse(request, "idp_unreachable", str(exc))
        except SuspiciousOperation as exc:
            code = "nonce_mismatch" if "Nonce" in str(exc) else "token_invalid"
            _refuse(request, code, str(exc))
        except (jwt.PyJWTError, ValueError, KeyError, TypeError) as exc:
            _refuse(request, "token_invalid", f"{type(exc).__name__}: {exc}")
        return None

    def retrieve_matching_jwk(self, token: Any) -> Any:
        """The IdP's signing key for this token: the one with its `kid` (and `alg`, when the key
        names one). A token without a `kid` is accepted only when the IdP has one signing key
        (the library assumes every token carries a `kid`)."""
        response = requests.get(
            self.OIDC_OP_JWKS_ENDPOINT, timeout=oidc_setting("OIDC_TIMEOUT", 10)
        )
        response.raise_for_status()
        keys = response.json().get("keys", [])
        header = jwt.get_unverified_header(token)
        kid, alg = header.get("kid"), header.get("alg")
        candidates = [
            key
            for key in keys
            if isinstance(key, dict)
            and key.get("use", "sig") == "sig"
            and key.get("alg", alg) == alg
            and (kid is None or key.get("kid") == kid)
        ]
        if len(candidates) != 1:
            raise SignInRefused(
                "token_invalid", f"{len(candidates)} signing keys match kid {kid!r} alg {alg!r}"
            )
        return jwt.PyJWK(candidates[0])

    def _verify_jws(self, payload: Any, key: Any) -> Any:
        """The signature, and what the library leaves unchecked: the audience is us (and, with
        several audiences, `azp` is us), the issuer is ours, the token has not expired."""
        header = jwt.get_unverified_header(payload)
        alg = header.get("alg")
        if alg != self.OIDC_RP_SIGN_ALGO:
            raise SignInRefused("token_invalid", f"alg {alg!r}, expected {self.OIDC_RP_SIGN_ALGO}")
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[alg],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=self.issuer,
                leeway=int(getattr(settings, "SAFESTOP_OIDC_CLOCK_SKEW_SECONDS", 60)),
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.InvalidAudienceError:
            raise SignInRefused(
                "wrong_audience",
                f"aud {jwt.decode(payload, options={'verify_signature': False}).get('aud')!r}",
            ) from None
        except jwt.InvalidIssuerError:
            raise SignInRefused("issuer_mismatch", "the ID token names another issuer") from None
        except jwt.ExpiredSignatureError:
            raise SignInRefused("token_expired", "the ID token has expired") from None
        except jwt.PyJWTError as exc:
            raise SignInRefused("token_invalid", f"{type(exc).__name__}: {exc}") from None
        audience = claims.get("aud")
        if isinstance(audience, list) and len(audience) > 1:
            if claims.get("azp") != self.OIDC_RP_CLIENT_ID:
                raise SignInRefused("wrong_audience", f"azp {claims.get('azp')!r}")
        return claims

    def get_or_create_user(self, access_token: Any, id_token: Any, payload: Any) -> Any:
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT and access_token:
            # Some IdPs (Okta's org server, Entra with many groups) put groups in userinfo only.
            info = self.get_userinfo(access_token, id_token, payload)
            if not isinstance(info, dict) or info.get("sub") != payload.get("sub"):
                raise SignInRefused("token_invalid", "userinfo names another subject")
            for name, value in info.items():
                claims.setdefault(name, value)
        return sign_in(issuer=self.issuer, claims=claims)


def _refused_page(request: HttpRequest, code: str, status: int = 403) -> HttpResponse:
    return render(
        request,
        "accounts/sso_refused.html",
        {"reason": code, "message": REFUSAL_MESSAGES.get(code, REFUSAL_MESSAGES["failed"])},
        status=status,
    )


REFUSAL_MESSAGES = {
    "no_mapped_group": _(
        "Your organisation's sign-in worked, but none of your groups gives you a role on any "
        "team here. Ask an administrator to map one of your groups to a team."
    ),
    "deactivated": _("Your account is deactivated. Ask an administrator."),
    "groups_claim_invalid": _(
        "Your organisation's sign-in sent your groups in a form this console does not accept. "
        "Ask an administrator to check the identity provider's groups claim."
    ),
    "idp_unreachable": _("The identity provider could not be reached. Try again in a minute."),
    "issuer_mismatch": _(
        "The answer did not come from the identity provider this console trusts. Start again; "
        "if it keeps happening, tell an administrator."
    ),
    "idp_error": _("The identity provider did not sign you in."),
    "state_mismatch": _(
        "This sign-in link was already used, has expired, or was started in another browser. "
        "Start again."
    ),
    "failed": _("The sign-in could not be completed. Start again."),
}


class StartView(OIDCAuthenticationRequestView):
    """`/login/sso/`: to the IdP, with state, nonce and a PKCE S256 challenge."""

    get_settings = staticmethod(oidc_setting)  # type: ignore[assignment]

    def __init__(self, **kwargs: Any) -> None:
        # Not the library's __init__: the endpoint comes from discovery, at the request.
        for key, value in kwargs.items():
            setattr(self, key, value)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not conf.sso_enabled():
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = discovery()["authorization_endpoint"]
        except DiscoveryError as exc:
            _refuse(request, exc.code, str(exc))
            return _refused_page(request, exc.code, status=503)
        self.OIDC_RP_CLIENT_ID = conf.client_id()
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """`/login/sso/callback/`: the IdP's answer. Any failure ends an existing session too (a
    failed re-check must not leave the old sign-in standing) and shows why."""

    get_settings = staticmethod(oidc_setting)  # type: ignore[assignment]

    def get(self, request: HttpRequest) -> HttpResponse:
        if not conf.sso_enabled():
            raise Http404("single sign-on is not configured")
        if request.GET.get("error"):
            _refuse(
                request,
                "idp_error",
                f"{request.GET.get('error')}: {request.GET.get('error_description', '')}",
            )
        elif "code" in request.GET and "state" in request.GET:
            states = request.session.get("oidc_states")
            if not isinstance(states, dict) or request.GET["state"] not in states:
                # Not the library's SuspiciousOperation (a bare 400): the person gets a page.
                _refuse(request, "state_mismatch", "the state is not one this session issued")
                return self.login_failure()
        else:
            _refuse(request, "failed", "the callback carried neither a code nor an error")
            return self.login_failure()
        return super().get(request)

    def login_failure(self) -> HttpResponse:
        request = self.request
        if request.user.is_authenticated:
            auth.logout(request)
        code = getattr(request, "safestop_sso_refusal", None)
        if code is None:
            _refuse(request, "failed", "authentication returned no user")
            code = "failed"
        status = 503 if code == "idp_unreachable" else 400 if code == "state_mismatch" else 403
        return _refused_page(request, code, status=status)


@require_POST
def logout(request: HttpRequest) -> HttpResponse:
    """Sign out here, and at the IdP too when the session came from it (RP-initiated logout):
    the IdP's end-session endpoint, with the ID token as the hint and the sign-in page to come
    back to."""
    login_url = reverse("console:login")
    target = login_url
    id_token = request.session.get("oidc_id_token")
    if id_token and conf.sso_enabled():
        try:
            end_session = discovery().get("end_session_endpoint")
        except DiscoveryError as exc:
            logger.warning("sso.logout_local_only detail=%s", exc)
            end_session = None
        if isinstance(end_session, str) and end_session:
            query = urlencode(
                {
                    "id_token_hint": id_token,
                    "client_id": conf.client_id(),
                    "post_logout_redirect_uri": request.build_absolute_uri(login_url),
                }
            )
            target = f"{end_session}?{query}"
    auth.logout(request)
    return HttpResponseRedirect(target)


class SessionRefresh(LibrarySessionRefresh):
    """Every `OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS` (15 minutes) a signed-in person's next page
    goes back through the IdP with `prompt=none`: still signed in there and still in a mapped
    group → back at once, roles re-applied; otherwise the callback ends the session."""

    get_settings = staticmethod(oidc_setting)  # type: ignore[assignment]

    def __init__(self, get_response: Any) -> None:
        super(LibrarySessionRefresh, self).__init__(get_response)
        self.OIDC_EXEMPT_URLS: list[Any] = []
        self.OIDC_STATE_SIZE = oidc_setting("OIDC_STATE_SIZE", 32)
        self.OIDC_AUTHENTICATION_CALLBACK_URL = oidc_setting(
            "OIDC_AUTHENTICATION_CALLBACK_URL", "accounts:sso_callback"
        )
        self.OIDC_RP_SCOPES = oidc_setting("OIDC_RP_SCOPES", "openid email")
        self.OIDC_USE_NONCE = oidc_setting("OIDC_USE_NONCE", True)
        self.OIDC_NONCE_SIZE = oidc_setting("OIDC_NONCE_SIZE", 32)

    @cached_property
    def exempt_urls(self) -> set[str]:
        return {
            reverse(name)
            for name in ("accounts:sso_start", "accounts:sso_callback", "console:logout")
        }

    @cached_property
    def exempt_url_patterns(self) -> set[re.Pattern[str]]:
        # Machine endpoints and websockets: a redirect to the IdP means nothing to them.
        return {re.compile(r"^/(api|scim|static|ws|metrics)(/|$)")}

    def is_refreshable_url(self, request: HttpRequest) -> bool:
        return conf.sso_enabled() and super().is_refreshable_url(request)

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if not self.is_refreshable_url(request):
            return None
        if request.session.get("oidc_id_token_expiration", 0) > time.time():
            return None
        if request.headers.get("HX-Request"):
            # An htmx fragment cannot follow a redirect to the IdP: reload the whole page,
            # whose request then makes the round trip.
            reload = HttpResponse(status=204)
            reload["HX-Refresh"] = "true"
            return reload
        try:
            self.OIDC_OP_AUTHORIZATION_ENDPOINT = discovery()["authorization_endpoint"]
        except DiscoveryError as exc:
            # Fail closed: a session that cannot be re-checked past its 15 minutes ends.
            logger.warning("sso.recheck_failed reason=idp_unreachable detail=%s", exc)
            auth.logout(request)
            return HttpResponseRedirect(reverse("console:login"))
        self.OIDC_RP_CLIENT_ID = conf.client_id()
        response: HttpResponse | None = super().process_request(request)
        return response
