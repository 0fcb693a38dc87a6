"""Failed sign-ins are throttled per user and per address (django-axes), so a password cannot be guessed: the
login page says so, answers 429 with Retry-After, and /metrics counts the failures."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

LIMIT = 5  # AXES_FAILURE_LIMIT (SAFESTOP_LOGIN_FAILURE_LIMIT)


def _sign_in(username: str, password: str, address: str = "198.51.100.1"):
    client = Client(REMOTE_ADDR=address)
    return client, client.post("/login/", {"username": username, "password": password})


def test_after_the_limit_even_the_right_password_is_refused_with_a_message(bob):
    for _ in range(LIMIT - 1):
        _client, wrong = _sign_in("bob", "nope")
        assert wrong.status_code == 200 and "do not match" in wrong.content.decode()
    _client, locking = _sign_in("bob", "nope")
    assert locking.status_code == 429
    client, right = _sign_in("bob", "pw-bob")
    assert right.status_code == 429
    page = right.content.decode()
    assert "Too many failed sign-ins" in page and 'name="password"' in page
    assert int(right["Retry-After"]) > 0
    assert client.get("/").status_code == 302  # not signed in


def test_the_user_is_locked_from_another_address_too(bob):
    for _ in range(LIMIT):
        _sign_in("bob", "nope", address="198.51.100.1")
    _client, elsewhere = _sign_in("bob", "pw-bob", address="198.51.100.2")
    assert elsewhere.status_code == 429


def test_one_address_guessing_many_users_is_locked_for_all_of_them(bob):
    for index in range(LIMIT):
        _sign_in(f"nobody{index}", "nope", address="198.51.100.3")
    _client, locked = _sign_in("bob", "pw-bob", address="198.51.100.3")
    assert locked.status_code == 429
    _client, fine = _sign_in("bob", "pw-bob", address="198.51.100.4")
    assert fine.status_code == 302


def test_a_success_before_the_limit_starts_the_count_again(bob):
    for _ in range(LIMIT - 1):
        _sign_in("bob", "nope", address="198.51.100.5")
    assert _sign_in("bob", "pw-bob", address="198.51.100.5")[1].status_code == 302
    for _ in range(LIMIT - 1):
        _sign_in("bob", "nope", address="198.51.100.6")
    assert _sign_in("bob", "pw-bob", address="198.51.100.6")[1].status_code == 302


def test_failed_sign_ins_are_counted_in_metrics(bob, as_staff):
    for _ in range(LIMIT + 1):
        _sign_in("bob", "nope")
    text = as_staff.get("/metrics").content.decode()
    assert f'safestop_login_failures{{outcome="failed"}} {LIMIT + 1}' in text
    assert 'safestop_login_failures{outcome="locked_out"}' in text
