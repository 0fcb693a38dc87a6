"""A real OpenID provider for the sign-in tests: the `oidc-provider-mock` package (authlib's
authorization server in Flask), started in a thread of the test process on a free port.

A nonce is required (`require_nonce`). The provider keeps no PKCE challenge, so it records every
token request (`token_requests`) and the tests check the verifier against the challenge
themselves. Its issuer is `http://localhost:<port>`.

    def test_x(sso):                      # the provider, and safestop's settings pointing at it
        sso.provider.set_user("u1", groups=["safestop-reviewers"], preferred_username="uma")
        response = sign_in_through(client, sso.provider, "u1")

`set_user` PUTs the person's claims to the provider (`/users/<sub>`); `sign_in_through` drives
the code flow with Django's test client on our side and httpx at the provider (the person's
"Authorize" click).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

CLIENT_ID = "safestop-console"
CLIENT_SECRET = "test-client-secret"
GROUP_ROLES = {
    "safestop-reviewers": "acme:reviewer",
    "safestop-admins": "acme:admin",
    "globex-viewers": "globex:viewer",
}


def _record_token_requests(app: Any, into: list[dict[str, str]]) -> None:
    """Keep every token request's form, so a test can check the PKCE verifier safestop sent
    against the challenge it sent before (this provider stores no challenge to check it)."""
    import flask

    @app.before_request
    def record() -> None:
        if flask.request.path == "/oauth2/token":
            into.append(flask.request.form.to_dict())


@dataclass
class Provider:
    url: str
    token_requests: list[dict[str, str]] = field(default_factory=list)

    @property
    def issuer(self) -> str:
        return self.url

    def set_user(self, sub: str, **claims: Any) -> None:
        claims.setdefault("email", f"{sub}@example.org")
        httpx.put(f"{self.url}/users/{sub}", json=claims, timeout=10).raise_for_status()

    def authorize(self, authorize_url: str, sub: str) -> str:
        """The person at the IdP clicks "Authorize" as `sub`: the redirect back to us."""
        answer = httpx.post(authorize_url, data={"sub": sub}, timeout=10)
        assert answer.status_code == 302, answer.text[:500]
        return answer.headers["location"]

    def id_token_for(self, client_id: str, sub: str, *, nonce: str = "n") -> str:
        """A genuine ID token from this provider, issued to another client (an attacker's app)."""
        import base64
        import hashlib
        import secrets

        verifier = secrets.token_urlsafe(48)
        challenge = (
            base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest())
            .rstrip(b"=")
            .decode()
        )
        redirect = "http://attacker.example/cb"
        query = httpx.QueryParams(
            response_type="code",
            client_id=client_id,
            redirect_uri=redirect,
            scope="openid email profile",
            state="s",
            nonce=nonce,
            code_challenge=challenge,
            code_challenge_method="S256",
        )
        back = self.authorize(f"{self.url}/oauth2/authorize?{query}", sub)
        code = parse_qs(urlsplit(back).query)["code"][0]
        token = httpx.post(
            f"{self.url}/oauth2/token",
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect,
                "client_id": client_id,
                "client_secret": "whatever",
                "code_verifier": verifier,
            },
            timeout=10,
        )
        token.raise_for_status()
        return str(token.json()["id_token"])


def _impostor_discovery() -> Any:
    import flask

    real = flask.request.host_url.rstrip("/")
    return flask.jsonify(
        {
            "issuer": real,
            "authorization_endpoint": f"{real}/oauth2/authorize",
            "token_endpoint": f"{real}/oauth2/token",
            "jwks_uri": f"{real}/jwks",
        }
    )


@contextmanager
def start_provider(*, access_token_max_age: timedelta = timedelta(hours=1)) -> Iterator[Provider]:
    import werkzeug.serving
    from oidc_provider_mock import app as provider_app

    os.environ.setdefault("AUTHLIB_INSECURE_TRANSPORT", "1")  # plain http on localhost
    app = provider_app(require_nonce=True, access_token_max_age=access_token_max_age)
    recorded: list[dict[str, str]] = []
    _record_token_requests(app, recorded)
    # An impostor's discovery document under another issuer URL, naming the real issuer.
    app.add_url_rule("/impostor/.well-known/openid-configuration", "impostor", _impostor_discovery)
    server = werkzeug.serving.make_server("localhost", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield Provider(url=f"http://localhost:{server.server_port}", token_requests=recorded)
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def sso_settings(provider: Provider, **extra: Any) -> dict[str, Any]:
    return {
        "SAFESTOP_OIDC_ISSUER": provider.issuer,
        "SAFESTOP_OIDC_CLIENT_ID": CLIENT_ID,
        "SAFESTOP_OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "SAFESTOP_OIDC_PROVIDER_NAME": "Example IdP",
        "SAFESTOP_OIDC_GROUP_ROLES": json.dumps(GROUP_ROLES),
        **extra,
    }


@dataclass
class Sso:
    provider: Provider


def _forget_process_state() -> None:
    from accounts import oidc, services

    oidc.discovery_forget()
    services._seeded_in_this_process = False


@pytest.fixture
def oidc_provider() -> Iterator[Provider]:
    with start_provider() as provider:
        yield provider


@pytest.fixture
def sso(oidc_provider: Provider, settings: Any, db: None) -> Iterator[Sso]:
    """The provider, and safestop configured to sign in through it (GROUP_ROLES seeded)."""
    for name, value in sso_settings(oidc_provider).items():
        setattr(settings, name, value)
    _forget_process_state()
    yield Sso(provider=oidc_provider)
    _forget_process_state()


def sign_in_through(client: Any, provider: Provider, sub: str, *, next_url: str = "") -> Any:
    """The whole code flow: /login/sso/ → the provider → our callback. Returns the callback's
    response (Django's test client)."""
    start = client.get("/login/sso/" + (f"?next={next_url}" if next_url else ""))
    assert start.status_code == 302, start.content[:300]
    back = provider.authorize(start["Location"], sub)
    return client.get(path_of(back))


def path_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path
