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


def test_the_docs_name_what_exists(settings):
    """docs/ARCHITECTURE.md and docs/OPERATIONS.md name these: they must stay true."""
    from pathlib import Path

    from runs import ledger, ledger_anchors, ledger_checks

    root = Path(__file__).resolve().parents[2]
    architecture = (root / "docs" / "ARCHITECTURE.md").read_text()
    operations = (root / "docs" / "OPERATIONS.md").read_text()
    for module, name in (
        (ledger, "entry_hash"),
        (ledger, "ledger_verify"),
        (ledger_anchors, "anchors_load"),
        (ledger_anchors, "anchor_write"),
        (ledger_checks, "verification_run"),
    ):
        assert f"`{name}`" in architecture and callable(getattr(module, name))
    assert (root / "runs/migrations/0013_ledger_keyed_hash_and_anchors.py").exists()
    for setting in ("SAFESTOP_LEDGER_KEY", "SAFESTOP_LEDGER_ANCHOR_DIR"):
        assert f"`{setting}`" in operations and hasattr(settings, setting)
    assert "### The ledger against a database writer" in operations
