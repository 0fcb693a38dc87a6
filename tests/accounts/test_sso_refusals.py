"""Bad answers on the way back from the IdP are refused — a page with the reason, one log line
(`sso.refused reason=...`), never a 500 and never a session: a token issued to another client,
an expired token, a replayed code, a state this session never issued, an issuer mix-up (on the
redirect, in the token, in the discovery document), a groups claim that is a string."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import SESSION_KEY
from django.test import Client

from accounts import oidc
from accounts.models import IdentityLink
from tests.support.oidc import path_of, sign_in_through, sso_settings, start_provider


def _refusals(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("sso.refused")]


def _refused(answer: Any, client: Client, caplog, reason: str, status: int = 403) -> None:
    assert answer.status_code == status
    assert f'data-reason="{reason}"' in answer.content.decode()
    assert SESSION_KEY not in client.session
    (line,) = _refusals(caplog)
    assert line.startswith(f"sso.refused reason={reason} ") and "\n" not in line


def test_a_token_issued_to_another_client_is_refused(client, sso, caplog, monkeypatch):
    sso.provider.set_user("sub-a", groups=["safestop-reviewers"])
    foreign = sso.provider.id_token_for("someone-elses-app", "sub-a")
    # The IdP hands us a genuine token whose audience is another application.
    monkeypatch.setattr(
        oidc.OIDCBackend,
        "get_token",
        lambda self, payload: {"id_token": foreign, "access_token": "x"},
    )
    caplog.clear()
    answer = sign_in_through(client, sso.provider, "sub-a")
    _refused(answer, client, caplog, "wrong_audience")
    assert "someone-elses-app" in _refusals(caplog)[0]
    assert not IdentityLink.objects.exists()


@pytest.mark.slow  # its own provider
def test_an_expired_token_is_refused(client, settings, db, caplog):
    with start_provider(access_token_max_age=timedelta(minutes=-10)) as provider:
        for name, value in sso_settings(provider).items():
            setattr(settings, name, value)
        oidc.discovery_forget()
        provider.set_user("sub-e", groups=["safestop-reviewers"])
        caplog.clear()
        answer = sign_in_through(client, provider, "sub-e")
    oidc.discovery_forget()
    _refused(answer, client, caplog, "token_expired")


def test_a_replayed_code_is_refused(client, sso, caplog):
    sso.provider.set_user("sub-r", groups=["safestop-reviewers"])
    start = client.get("/login/sso/")
    first = sso.provider.authorize(start["Location"], "sub-r")
    assert client.get(path_of(first)).status_code == 302  # used once: signed in
    client.post("/logout/")

    # Replayed in a fresh attempt: its own (valid) state, the old code.
    again = client.get("/login/sso/")
    state = parse_qs(urlsplit(again["Location"]).query)["state"][0]
    code = parse_qs(urlsplit(first).query)["code"][0]
    caplog.clear()
    answer = client.get(f"/login/sso/callback/?code={code}&state={state}")
    _refused(answer, client, caplog, "code_refused")
    assert "invalid_grant" in _refusals(caplog)[0]


def test_the_same_callback_twice_is_refused_the_second_time(client, sso, caplog):
    sso.provider.set_user("sub-t", groups=["safestop-reviewers"])
    start = client.get("/login/sso/")
    back = path_of(sso.provider.authorize(start["Location"], "sub-t"))
    assert client.get(back).status_code == 302
    other = Client()
    caplog.clear()
    _refused(other.get(back), other, caplog, "state_mismatch", status=400)


def test_a_state_this_session_never_issued_is_refused(client, sso, caplog):
    sso.provider.set_user("sub-s", groups=["safestop-reviewers"])
    start = client.get("/login/sso/")
    back = sso.provider.authorize(start["Location"], "sub-s")
    code = parse_qs(urlsplit(back).query)["code"][0]
    caplog.clear()
    answer = client.get(f"/login/sso/callback/?code={code}&state=forged")
    _refused(answer, client, caplog, "state_mismatch", status=400)


def test_an_issuer_named_on_the_redirect_must_be_ours(client, sso, caplog):
    """RFC 9207: an authorization response naming another issuer is a mix-up."""
    sso.provider.set_user("sub-i", groups=["safestop-reviewers"])
    start = client.get("/login/sso/")
    back = path_of(sso.provider.authorize(start["Location"], "sub-i"))
    caplog.clear()
    answer = client.get(back + "&iss=https%3A%2F%2Fevil.example")
    _refused(answer, client, caplog, "issuer_mismatch")


def test_a_token_from_another_issuer_is_refused(client, sso, caplog):
    """The token endpoint answers with a token whose `iss` is not the configured issuer (here:
    the same provider reached by another name, so it signs as `http://127.0.0.1:<port>`)."""
    sso.provider.set_user("sub-m", groups=["safestop-reviewers"])
    document = dict(oidc.discovery())
    document["token_endpoint"] = document["token_endpoint"].replace("localhost", "127.0.0.1")
    oidc._discovery_cache[sso.provider.issuer] = (float("inf"), document)
    caplog.clear()
    answer = sign_in_through(client, sso.provider, "sub-m")
    _refused(answer, client, caplog, "issuer_mismatch")


def test_a_discovery_document_naming_another_issuer_is_refused(client, sso, settings, caplog):
    settings.SAFESTOP_OIDC_ISSUER = f"{sso.provider.issuer}/impostor"
    caplog.clear()
    answer = client.get("/login/sso/")
    assert answer.status_code == 503
    (line,) = _refusals(caplog)
    assert line.startswith("sso.refused reason=issuer_mismatch ")


@pytest.mark.parametrize("groups", ["safestop-reviewers", {"a": 1}, ["ok", 3]])
def test_a_groups_claim_that_is_not_a_list_of_strings_is_refused(client, sso, caplog, groups):
    sso.provider.set_user("sub-g", groups=groups)
    caplog.clear()
    answer = sign_in_through(client, sso.provider, "sub-g")
    _refused(answer, client, caplog, "groups_claim_invalid")
    assert not IdentityLink.objects.exists()


def test_the_idp_saying_no_is_a_page_not_an_error(client, sso, caplog):
    start = client.get("/login/sso/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    caplog.clear()
    answer = client.get(f"/login/sso/callback/?error=access_denied&state={state}")
    _refused(answer, client, caplog, "idp_error")


def test_a_callback_with_nothing_in_it_is_refused(client, sso, caplog):
    caplog.clear()
    _refused(client.get("/login/sso/callback/"), client, caplog, "failed")


def test_an_unreachable_idp_is_a_503_page(client, settings, db, caplog):
    settings.SAFESTOP_OIDC_ISSUER = "http://127.0.0.1:9"
    settings.SAFESTOP_OIDC_CLIENT_ID = "x"
    oidc.discovery_forget()
    caplog.clear()
    answer = client.get("/login/sso/")
    assert answer.status_code == 503 and 'data-reason="idp_unreachable"' in answer.content.decode()
    assert len(_refusals(caplog)) == 1
