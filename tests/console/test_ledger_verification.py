"""The audit page's ledger verification: recorded walks, never a walk inside a page request.

A walk of 1,000,000 entries takes 22–25 s (docs/BENCHMARKS.md), so the page shows the latest
recorded walk and "Verify now" queues one, which a thread of the serving process runs here (the
embedded default; a Celery worker in production, tests/dispatch/test_celery_worker.py).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from notifications import services as notify
from runs import ledger_checks
from runs.models import LedgerEntry, LedgerVerification, Membership, Role
from tests.support.htmx import htmx
from tests.support.ledger import behind_the_triggers
from tests.support.scenarios import stopped_cleanly
from tests.support.stack import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _finished(verification_id: int) -> LedgerVerification:
    return wait_until(
        lambda: LedgerVerification.objects.filter(
            pk=verification_id, finished_at__isnull=False
        ).first(),
        timeout=15,
        what=f"verification {verification_id} to finish",
    )


def _tamper(entry: LedgerEntry) -> None:
    behind_the_triggers("UPDATE runs_ledgerentry SET reason = 'timeout' WHERE id = %s", [entry.pk])


@pytest.fixture
def no_walk_in_requests(monkeypatch):
    """Counts the walks of the ledger, so a test can show that a page request made none."""
    walks: list[str] = []
    real = ledger_checks.ledger_verify

    def guarded(**kwargs):
        walks.append("walk")
        return real(**kwargs)

    monkeypatch.setattr(ledger_checks, "ledger_verify", guarded)
    return walks


def test_the_page_shows_the_last_walk_without_walking(as_admin, team, no_walk_in_requests):
    body = as_admin.get("/audit/").content.decode()
    assert "Ledger not verified yet" in body and 'data-testid="ledger-verify-now"' in body
    stopped_cleanly(team)
    notify.ledger_check()  # the scheduled walk, as beat or the background loop runs it
    assert no_walk_in_requests == ["walk"]

    body = as_admin.get("/audit/").content.decode()
    fragment = as_admin.get("/audit/verify/", **htmx("ledger-verify")).content.decode()

    entries = LedgerEntry.objects.count()
    for shown in (body, fragment):
        assert f"Ledger verified:</strong> {entries} entries, every hash chain intact" in shown
        assert "scheduled" in shown and 'data-testid="ledger-verify-now"' in shown
    assert no_walk_in_requests == ["walk"]  # neither page request walked


def test_verify_now_queues_one_walk_that_a_worker_runs_and_records(as_admin, alice, team):
    stopped_cleanly(team)
    response = as_admin.post("/audit/verify/", **htmx("ledger-verify"))
    assert response.status_code == 200
    [verification] = LedgerVerification.objects.all()
    assert verification.requested_by == alice.username

    done = _finished(verification.pk)
    assert done.started_at is not None and done.checked == LedgerEntry.objects.count()
    assert done.broken_entry_id is None and done.error == ""
    body = as_admin.get("/audit/verify/", **htmx("ledger-verify")).content.decode()
    assert "every hash chain intact" in body and f"asked by {alice.username}" in body
    assert 'hx-trigger="every 2s"' not in body  # nothing running: the line stops polling


def test_a_walk_already_queued_is_not_queued_twice_and_the_line_polls(as_admin, team):
    queued, created = ledger_checks.verification_request(requested_by="bob")
    assert created
    body = as_admin.post("/audit/verify/", **htmx("ledger-verify")).content.decode()
    assert LedgerVerification.objects.count() == 1  # the second click joined the first
    assert 'data-testid="ledger-verify-running"' in body and 'hx-trigger="every 2s"' in body
    assert 'data-testid="ledger-verify-now"' not in body
    # Without JavaScript: post, then redirect to the verification page.
    plain = as_admin.post("/audit/verify/")
    assert plain.status_code == 302 and plain["Location"] == "/audit/verify/"
    assert LedgerVerification.objects.count() == 1
    # A walk asked for an hour ago and never finished died with its worker: a new one may start.
    LedgerVerification.objects.filter(pk=queued.pk).update(
        requested_at=timezone.now() - timedelta(hours=2)
    )
    _again, created = ledger_checks.verification_request(requested_by="bob")
    assert created


def test_a_broken_chain_is_shown_where_it_breaks_and_only_to_its_teams_admins(
    as_admin, team, other_team, django_user_model
):
    run = stopped_cleanly(team)
    entry = LedgerEntry.objects.filter(run=run, action="run.stop_requested").get()
    _tamper(entry)
    as_admin.post("/audit/verify/", **htmx("ledger-verify"))
    [verification] = LedgerVerification.objects.all()
    done = _finished(verification.pk)
    assert done.broken_entry_id == entry.pk and done.broken_run_id == run.pk

    body = as_admin.get("/audit/").content.decode()
    assert "Ledger verification FAILED" in body and f"#{entry.pk}" in body and run.pk in body

    other_admin = django_user_model.objects.create_user("olga", password="x")
    Membership.objects.create(user=other_admin, team=other_team, role=Role.ADMIN)
    client = Client()
    client.force_login(other_admin)
    foreign = client.get("/audit/").content.decode()
    assert "A chain outside your teams is broken" in foreign and run.pk not in foreign


def test_a_walk_that_fails_is_recorded_as_failed_not_as_passed(as_admin, team, monkeypatch):
    def broken_database(**kwargs):
        raise RuntimeError("connection to the database was lost")

    monkeypatch.setattr(ledger_checks, "ledger_verify", broken_database)
    with pytest.raises(RuntimeError):
        notify.ledger_check()
    [verification] = LedgerVerification.objects.all()
    assert verification.finished_at is not None and "database was lost" in verification.error
    body = as_admin.get("/audit/").content.decode()
    assert "could not finish" in body and "database was lost" in body
    assert "every hash chain intact" not in body


def test_a_redelivered_walk_is_walked_once(team):
    verification, _ = ledger_checks.verification_request(requested_by="bob")
    assert ledger_checks.verification_claim(verification.pk) is not None
    assert ledger_checks.verification_claim(verification.pk) is None  # already started
    assert notify.ledger_check(verification.pk) is None  # claims nothing, walks nothing
    assert LedgerVerification.objects.get(pk=verification.pk).finished_at is None


def test_only_admins_see_or_ask_for_a_verification(as_reviewer, as_viewer):
    for client in (as_reviewer, as_viewer):
        assert client.get("/audit/verify/").status_code == 403
        assert client.post("/audit/verify/").status_code == 403
    assert LedgerVerification.objects.count() == 0


def test_the_line_says_what_the_anchors_showed_and_a_cut_tail_fails_it(as_admin, team):
    run = stopped_cleanly(team)
    notify.ledger_check()  # the scheduled walk anchors every chain head it verified
    body = as_admin.get("/audit/").content.decode()
    assert "0 chain heads found as anchored outside the database" in body
    assert "new anchor written" in body

    notify.ledger_check()
    body = as_admin.get("/audit/").content.decode()
    assert "1 chain head found as anchored outside the database" in body
    assert "new anchor written" not in body  # nothing moved since

    last = LedgerEntry.objects.filter(run=run).order_by("-run_seq").first()
    behind_the_triggers("DELETE FROM runs_ledgerentry WHERE id = %s", [last.pk])
    assert notify.ledger_check() is not None
    body = as_admin.get("/audit/").content.decode()
    assert "Ledger verification FAILED" in body and "removed from its end" in body


def test_an_anchor_that_cannot_be_written_is_said_beside_a_passed_walk(
    as_admin, team, settings, tmp_path
):
    stopped_cleanly(team)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    settings.SAFESTOP_LEDGER_ANCHOR_DIR = str(blocked)
    notify.ledger_check()
    [walk] = LedgerVerification.objects.all()
    assert walk.broken_entry_id is None and walk.anchor_written == ""
    assert "FileExistsError" in walk.anchor_error
    body = as_admin.get("/audit/").content.decode()
    assert "every hash chain intact" in body and "The anchor could not be written" in body
