"""The ledger against someone who can write the database and switch its triggers off, but holds
no ledger key and cannot reach the anchor directory (docs/OPERATIONS.md)."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.core.management import call_command
from django.db import DatabaseError, transaction

from runs import ledger_checks, services
from runs.actors import Actor
from runs.ledger import KEYED_HASH, LEGACY_HASH, _body, ledger_verify
from runs.ledger_anchors import anchors_load
from runs.models import LedgerEntry, LedgerVerification
from tests.support.ledger import behind_the_triggers, legacy_digest, rechain
from tests.support.scenarios import stopped_cleanly

pytestmark = pytest.mark.django_db
ALICE = Actor("user", "1", "alice")
KEY_A = "a:" + "A" * 32
KEY_B = "b:" + "B" * 32


def _stopped_run(team):
    return stopped_cleanly(team, by=ALICE)


def _recorded_walk() -> LedgerVerification:
    """A scheduled walk, as beat or the background loop runs it: it anchors what it verified."""
    verification = ledger_checks.verification_start_scheduled()
    ledger_checks.verification_run(verification)
    verification.refresh_from_db()
    return verification


def _plain_sha256(columns):
    """What a writer without the key can compute: the same columns, hashed without a key."""
    return hashlib.sha256(_body({**columns, "hash_version": KEYED_HASH})).hexdigest()


def test_new_entries_are_keyed_and_name_their_key(team, settings):
    settings.SAFESTOP_LEDGER_KEY = KEY_A
    run = _stopped_run(team)
    entries = LedgerEntry.objects.filter(run=run)
    assert {(e.hash_version, e.key_id) for e in entries} == {(KEYED_HASH, "a")}
    assert ledger_verify(run_id=run.pk) == (entries.count(), None)


def test_a_changed_team_slug_is_found(team):
    run = _stopped_run(team)
    target = LedgerEntry.objects.filter(run=run, action="run.stop_requested").get()
    behind_the_triggers(
        "UPDATE runs_ledgerentry SET team_slug = 'other-team' WHERE id = %s", [target.pk]
    )
    _checked, broken = ledger_verify(run_id=run.pk)
    assert broken is not None and broken.entry_id == target.pk
    assert "changed" in broken.problem


def test_an_edited_payload_with_recomputed_plain_hashes_is_found(team):
    run = _stopped_run(team)
    first = LedgerEntry.objects.filter(run=run).order_by("run_seq").first()

    def forge(columns):
        if columns["run_seq"] == first.run_seq:
            columns["payload"] = {**columns["payload"], "title": "nothing to see"}

    rechain(run.pk, _plain_sha256, hash_version=KEYED_HASH, key_id=first.key_id, edit=forge)
    _checked, broken = ledger_verify(run_id=run.pk)
    assert broken is not None and broken.entry_id == first.pk
    assert "content does not match its hash" in broken.problem


def test_a_chain_downgraded_to_the_plain_format_is_found_once_anchored(team):
    run = _stopped_run(team)
    assert _recorded_walk().anchor_written

    def forge(columns):
        if columns["run_seq"] == 1:
            columns["payload"] = {**columns["payload"], "title": "nothing to see"}

    # Marked as written before the chain was keyed, with the plain hashes recomputed.
    rechain(run.pk, legacy_digest, hash_version=LEGACY_HASH, edit=forge)
    _checked, broken = ledger_verify(run_id=run.pk)
    assert broken is not None and broken.run_id == run.pk
    assert "anchor" in broken.problem
    # A run the anchor has not seen yet cannot be downgraded either.
    fresh = _stopped_run(team)
    rechain(fresh.pk, legacy_digest, hash_version=LEGACY_HASH)
    _checked, broken = ledger_verify(run_id=fresh.pk)
    assert broken is not None and broken.run_id == fresh.pk and broken.run_seq == 1
    assert "no anchor covers" in broken.problem


def test_deleting_a_runs_last_entry_is_found_through_the_anchor(team, capsys):
    run = _stopped_run(team)
    last = LedgerEntry.objects.filter(run=run).order_by("-run_seq").first()
    walk = _recorded_walk()
    assert walk.problem == "" and walk.anchor_written and walk.anchor_error == ""
    behind_the_triggers("DELETE FROM runs_ledgerentry WHERE id = %s", [last.pk])
    _checked, broken = ledger_verify()
    assert broken is not None
    assert (broken.entry_id, broken.run_id, broken.run_seq) == (last.pk, run.pk, last.run_seq)
    assert "removed from its end" in broken.problem and walk.anchor_written in broken.problem
    with pytest.raises(SystemExit) as exited:
        call_command("verify_ledger")
    assert exited.value.code == 1
    assert f"entry {last.pk}" in capsys.readouterr().err
    # The recorded walk says so too, and anchors nothing over the break.
    again = _recorded_walk()
    assert again.broken_entry_id == last.pk and again.anchor_written == ""


def test_deleting_a_whole_chain_is_found_through_the_anchor(team):
    run = _stopped_run(team)
    _recorded_walk()
    behind_the_triggers("DELETE FROM runs_ledgerentry WHERE run_id = %s", [run.pk])
    _checked, broken = ledger_verify()
    assert broken is not None and broken.run_id == run.pk
    assert "no entries left" in broken.problem


@pytest.mark.django_db(transaction=True)  # committed entries: TRUNCATE in a transaction of its own
def test_truncate_of_the_ledger_is_refused(team):
    _stopped_run(team)
    with pytest.raises(DatabaseError, match="TRUNCATE refused"), transaction.atomic():
        with transaction.get_connection().cursor() as cursor:
            cursor.execute("TRUNCATE runs_ledgerentry CASCADE")
    assert LedgerEntry.objects.exists()
    # (The suite's own flush after this test empties it: tests/support/ledger.py.)


def test_an_old_format_chain_still_verifies_and_is_anchored(team):
    run = _stopped_run(team)
    rechain(run.pk, legacy_digest, hash_version=LEGACY_HASH)  # as written before the upgrade
    count = LedgerEntry.objects.filter(run=run).count()
    assert ledger_verify(run_id=run.pk) == (count, None)
    walk = _recorded_walk()
    assert walk.problem == "" and walk.anchor_written
    # The chain goes on, keyed, after its plain entries; and still verifies with the anchor.
    services.run_close(run_id=run.pk, actor=ALICE)
    newest = LedgerEntry.objects.filter(run=run).order_by("-run_seq").first()
    assert newest.hash_version == KEYED_HASH and newest.run_seq == count + 1
    assert ledger_verify() == (LedgerEntry.objects.count(), None)


def test_walks_anchor_only_the_heads_that_moved(team, ledger_anchor_dir):
    run = _stopped_run(team)
    first = _recorded_walk()
    assert first.anchor_written and first.anchored_heads == 0
    second = _recorded_walk()
    assert second.anchor_written == "" and second.anchored_heads == 1  # nothing new
    services.run_close(run_id=run.pk, actor=ALICE)
    third = _recorded_walk()
    assert third.anchor_written and third.anchored_heads == 1
    written = json.loads((ledger_anchor_dir / third.anchor_written).read_text())
    head = LedgerEntry.objects.filter(run=run).order_by("-run_seq").first()
    assert written["heads"] == [[run.pk, head.run_seq, head.hash, head.pk]]
    assert anchors_load().files == 2


def test_an_edited_anchor_is_not_trusted(team, ledger_anchor_dir):
    run = _stopped_run(team)
    name = _recorded_walk().anchor_written
    path = ledger_anchor_dir / name
    body = json.loads(path.read_text())
    body["heads"] = [[run.pk, 1, body["heads"][0][2], body["heads"][0][3]]]  # claim a shorter chain
    path.write_text(json.dumps(body))
    _checked, broken = ledger_verify()
    assert broken is not None and broken.entry_id == 0
    assert name in broken.problem and "signature does not match" in broken.problem


def test_rotated_keys_verify_old_entries_and_a_dropped_key_is_named(team, settings):
    settings.SAFESTOP_LEDGER_KEY = KEY_A
    run = _stopped_run(team)
    _recorded_walk()
    settings.SAFESTOP_LEDGER_KEY = f"{KEY_B}\n{KEY_A}"  # B signs from now on, A still verifies
    services.run_close(run_id=run.pk, actor=ALICE)
    assert {e.key_id for e in LedgerEntry.objects.filter(run=run)} == {"a", "b"}
    assert ledger_verify() == (LedgerEntry.objects.count(), None)
    settings.SAFESTOP_LEDGER_KEY = KEY_B
    _checked, broken = ledger_verify()
    assert broken is not None and "'a'" in broken.problem
