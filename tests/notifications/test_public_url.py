"""Links in notifications use the server's real address: SAFESTOP_PUBLIC_URL when it is set,
else the address `manage.py serve` listens on; deadlines read as times, not ISO strings."""

from __future__ import annotations

import pytest

from console.management.commands.serve import public_url
from notifications.events import public_url as link_to
from notifications.events import readable_time


def test_serve_links_to_the_address_it_listens_on(monkeypatch):
    monkeypatch.delenv("SAFESTOP_PUBLIC_URL", raising=False)
    assert public_url("127.0.0.1", 8101) == "http://127.0.0.1:8101"
    assert public_url("0.0.0.0", 8101) == "http://127.0.0.1:8101"  # a wildcard is no address
    assert public_url("::1", 9000) == "http://[::1]:9000"


def test_an_explicit_public_url_wins(monkeypatch):
    monkeypatch.setenv("SAFESTOP_PUBLIC_URL", "https://safestop.example.com/")
    assert public_url("0.0.0.0", 8101) == "https://safestop.example.com"


def test_links_are_built_on_the_setting(settings):
    settings.SAFESTOP_PUBLIC_URL = "http://127.0.0.1:8101"
    assert link_to("/approvals/appr_1/") == "http://127.0.0.1:8101/approvals/appr_1/"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("2026-12-03T11:42:07.123456+00:00", "2026-12-03 11:42 UTC"),
        ("2026-12-03T12:42:07+01:00", "2026-12-03 11:42 UTC"),
        ("soon", "soon"),
        ("", ""),
    ],
)
def test_a_deadline_reads_as_a_time(raw, shown):
    assert readable_time(raw) == shown


# --------------------------------------------------------------------------------------------
# what the messages say


def _entry(action: str, payload: dict, reason: str = ""):
    from runs.models import LedgerEntry

    return LedgerEntry(action=action, payload=payload, reason=reason, run_seq=3)


@pytest.mark.django_db
def test_an_interruption_counts_its_writes_in_words(team):
    from notifications.events import event_for_entry
    from tests.support.scenarios import new_run

    run = new_run(team, title="Deploy")
    one = event_for_entry(_entry("run.interrupted", {"writes_in_flight": ["c1"]}), run)
    two = event_for_entry(_entry("run.interrupted", {"writes_in_flight": ["c1", "c2"]}), run)
    assert one is not None and two is not None
    assert one.message["title"] == "Run interrupted with 1 unconfirmed write: Deploy"
    assert two.message["title"] == "Run interrupted with 2 unconfirmed writes: Deploy"
    assert "(s)" not in one.message["title"] + two.message["title"]


@pytest.mark.django_db
def test_an_approval_notice_shows_its_deadline_as_a_time(team):
    from notifications.events import event_for_entry
    from tests.support.scenarios import new_run

    run = new_run(team)
    payload = {
        "approval_id": "appr_7",
        "subject": "payments.refund",
        "deadline": "2026-12-03T11:42:07.123456+00:00",
    }
    notice = event_for_entry(_entry("approval.requested", payload), run)
    assert notice is not None
    assert ["Expires", "2026-12-03 11:42 UTC"] in notice.message["facts"]


@pytest.mark.django_db
def test_an_expired_outbox_approval_says_nothing_was_sent(team):
    from notifications.events import event_for_entry
    from tests.support.scenarios import new_run

    run = new_run(team)
    mail = event_for_entry(
        _entry("approval.expired", {"approval_id": "appr_8", "outbox_id": "obx_3"}), run
    )
    call = event_for_entry(
        _entry("approval.expired", {"approval_id": "appr_9", "tool_call_id": "c1"}), run
    )
    assert mail is not None and call is not None
    assert "never be sent" in mail.message["text"] and "call" not in mail.message["text"]
    assert "held call was refused" in call.message["text"]
