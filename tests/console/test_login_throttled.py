"""Failed sign-ins are throttled per (username, address) pair (django-axes): the login page says
so, answers 429 with Retry-After, the lock grows with each further lockout of the pair, and
/metrics counts the failures. Nobody can lock another person, or a whole address, out."""

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


def test_wrong_passwords_from_one_address_never_lock_the_user_out_elsewhere(bob):
    for _ in range(LIMIT + 3):
        _sign_in("bob", "nope", address="198.51.100.1")
    assert _sign_in("bob", "pw-bob", address="198.51.100.1")[1].status_code == 429
    _client, elsewhere = _sign_in("bob", "pw-bob", address="198.51.100.2")
    assert elsewhere.status_code == 302


def test_guessing_one_users_password_never_locks_the_address_for_others(bob, charlie):
    for _ in range(LIMIT):
        _sign_in("bob", "nope", address="198.51.100.3")
    _client, locked = _sign_in("bob", "pw-bob", address="198.51.100.3")
    assert locked.status_code == 429
    _client, neighbour = _sign_in("charlie", "pw-charlie", address="198.51.100.3")
    assert neighbour.status_code == 302


@pytest.mark.slow
def test_each_further_lockout_of_the_pair_lasts_twice_as_long(bob, settings):
    from datetime import timedelta

    from axes.models import AccessAttempt, AccessFailureLog

    base = settings.SAFESTOP_LOGIN_COOLOFF_SECONDS
    waits = []
    for _round in range(3):
        for _ in range(LIMIT):
            _sign_in("bob", "nope", address="198.51.100.7")
        _client, locked = _sign_in("bob", "pw-bob", address="198.51.100.7")
        assert locked.status_code == 429
        waits.append(int(locked["Retry-After"]))
        # The lock runs out: move every attempt back past it (the failure log is kept).
        past = timedelta(seconds=waits[-1] + 1)
        for model in (AccessAttempt, AccessFailureLog):
            for row in model.objects.all():
                model.objects.filter(pk=row.pk).update(attempt_time=row.attempt_time - past)
    assert waits == [base, 2 * base, 4 * base]
    # Another address's first lockout for the same user starts at the base again.
    for _ in range(LIMIT):
        _sign_in("bob", "nope", address="198.51.100.8")
    assert int(_sign_in("bob", "pw-bob", address="198.51.100.8")[1]["Retry-After"]) == base


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


def test_a_sign_out_whose_form_carries_a_nul_username_is_not_a_500(client, bob) -> None:
    """django-axes asks the lock's length on sign-out too, with the posted form: a NUL in it
    must not reach PostgreSQL (found by tests/faults/test_fuzz_inputs.py)."""
    client.force_login(bob)
    response = client.post("/logout/", {"username": "bo\x00b"})
    assert response.status_code == 302
    assert "_auth_user_id" not in client.session
