"""The sign-in and SCIM endpoints answer hostile requests with a 4xx, never a 5xx: every method,
junk query strings and bodies, with single sign-on and SCIM off and on (the IdP unreachable)."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts import oidc

PATHS = [
    "/login/sso/",
    "/login/sso/callback/",
    "/login/sso/callback/?code=x&state=y",
    "/login/sso/callback/?code=%00&state=%ff&iss=%0a",
    "/login/sso/callback/?error=%00",
    "/login/sso/?next=https://evil.example/",
    "/logout/",
    "/scim/v2/Users",
    "/scim/v2/Users?filter=%00&startIndex=-5&count=abc",
    '/scim/v2/Users?filter=userName eq "a\\"b"',
    "/scim/v2/Users/1",
    "/scim/v2/Users/%00",
    "/scim/v2/Users/99999999999999999999999",
]
BODIES = ["", "{", "[]", '{"Operations": [{"op": "replace", "path": 5}]}', "\x00\xff"]


@pytest.mark.parametrize("configured", [False, True], ids=["off", "on"])
def test_no_hostile_request_answers_5xx(settings, db, configured):
    if configured:
        settings.SAFESTOP_OIDC_ISSUER = "http://127.0.0.1:9"  # nothing listens there
        settings.SAFESTOP_OIDC_CLIENT_ID = "x"
        settings.SAFESTOP_SCIM_TOKEN = "t" * 20
    oidc.discovery_forget()
    client = Client(HTTP_AUTHORIZATION="Bearer " + "t" * 20, raise_request_exception=False)
    answers = []
    for path in PATHS:
        for method in ("get", "post", "put", "patch", "delete", "head", "options"):
            for body in BODIES if method in {"post", "put", "patch"} else [""]:
                call = getattr(client, method)
                response = (
                    call(path, body, content_type="application/json")
                    if method in {"post", "put", "patch"}
                    else call(path)
                )
                answers.append((method, path, response.status_code))
    server_errors = [answer for answer in answers if answer[2] >= 500 and answer[2] != 503]
    assert server_errors == []
    # 503 only where it means "the IdP cannot be reached", never otherwise
    assert all(path.startswith("/login/sso/") for _m, path, code in answers if code == 503)
