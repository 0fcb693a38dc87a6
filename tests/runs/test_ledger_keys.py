"""SAFESTOP_LEDGER_KEY: `id:secret`, several for rotation, a bare secret named by its fingerprint,
and a setting that cannot work refused with a reason."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs.ledger_keys import key_by_id, ledger_keys, signing_key


def test_the_first_key_signs_and_every_key_verifies(settings):
    settings.SAFESTOP_LEDGER_KEY = "new:" + "n" * 20 + ",\nold:" + "o" * 20
    assert signing_key().id == "new"
    assert {key.id for key in ledger_keys().by_id.values()} == {"new", "old"}
    assert key_by_id("old") is not None and key_by_id("gone") is None
    assert "o" * 20 not in repr(key_by_id("old"))  # a traceback never shows a secret


def test_a_bare_secret_is_named_by_its_fingerprint(settings):
    settings.SAFESTOP_LEDGER_KEY = "s" * 40
    first = signing_key().id
    assert first.startswith("k") and len(first) == 13
    settings.SAFESTOP_LEDGER_KEY = "t" * 40
    assert signing_key().id != first


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "empty"),
        ("a:short", "shorter than 16"),
        ("bad!:" + "x" * 20, "key id"),
        ("a:" + "x" * 20 + " a:" + "y" * 20, "appears twice"),
    ],
)
def test_a_key_setting_that_cannot_work_is_refused(settings, value, says):
    settings.SAFESTOP_LEDGER_KEY = value
    with pytest.raises(ImproperlyConfigured, match=says):
        ledger_keys()
