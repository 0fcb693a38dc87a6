"""`SAFESTOP_PASSWORD_LOGIN=off` leaves password sign-in to superusers (break glass), and
django-axes still throttles it; the IdP's callback is not counted as a password guess."""

from __future__ import annotations

import pytest
from django.contrib.auth import SESSION_KEY, get_user_model
from django.test import Client

from tests.support.oidc import sign_in_through

User = get_user_model()
LIMIT = 5  # AXES_FAILURE_LIMIT


def _sign_in(username: str, password: str, address: str = "198.51.100.20"):
    client = Client(REMOTE_ADDR=address)
    return client, client.post("/login/", {"username": username, "password": password})


@pytest.fixture
def no_passwords(settings):
    settings.SAFESTOP_PASSWORD_LOGIN = False


def test_with_passwords_off_only_a_superuser_signs_in_with_one(no_passwords, bob):
    User.objects.create_superuser("root", password="pw-root")
    client, refused = _sign_in("bob", "pw-bob")
    assert refused.status_code == 200 and "do not match" in refused.content.decode()
    assert SESSION_KEY not in client.session
    client, allowed = _sign_in("root", "pw-root")
    assert allowed.status_code == 302 and SESSION_KEY in client.session


def test_with_passwords_off_an_existing_password_session_ends(settings, bob):
    client, signed_in = _sign_in("bob", "pw-bob")
    assert client.get("/").status_code == 200
    settings.SAFESTOP_PASSWORD_LOGIN = False
    assert client.get("/").status_code == 302


def test_with_passwords_off_axes_still_throttles_the_break_glass(no_passwords, db):
    User.objects.create_superuser("root", password="pw-root")
    for _ in range(LIMIT):
        _sign_in("root", "nope", address="198.51.100.21")
    _client, locked = _sign_in("root", "pw-root", address="198.51.100.21")
    assert locked.status_code == 429


def test_the_login_page_hides_the_password_form_behind_break_glass(no_passwords, client, sso):
    page = client.get("/login/").content.decode()
    assert "Sign in with Example IdP" in page
    assert "break glass" in page and 'name="password"' in page


def test_refused_idp_sign_ins_do_not_lock_the_address(client, sso, bob):
    sso.provider.set_user("sub-n", groups=["not-mapped"])
    for _ in range(LIMIT + 1):
        assert sign_in_through(Client(), sso.provider, "sub-n").status_code == 403
    _client, fine = _sign_in("bob", "pw-bob", address="127.0.0.1")
    assert fine.status_code == 302
