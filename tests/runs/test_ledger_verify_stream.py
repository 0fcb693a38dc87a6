"""The ledger verification walks every chain in chunks, reports progress and still finds the
first changed entry wherever it sits, in bounded memory (a ledger of millions of entries)."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from runs.ledger import VerifyProgress, ledger_verify
from runs.models import LedgerEntry
from tests.support.ledger import behind_the_triggers
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db


def _three_runs(team) -> list[str]:
    return [make_running(team)[0].pk for _ in range(3)]


def _forge(entry_id: int) -> None:
    """What a superuser could do behind the append-only triggers' back."""
    behind_the_triggers("UPDATE runs_ledgerentry SET actor = 'mallory' WHERE id = %s", [entry_id])


def _walk_order() -> list[int]:
    return list(LedgerEntry.objects.order_by("run_id", "run_seq").values_list("pk", flat=True))


@pytest.mark.parametrize("position", ["first", "middle", "last"])
def test_a_changed_entry_is_found_across_chunk_boundaries(team, position):
    _three_runs(team)
    order = _walk_order()
    assert len(order) >= 6, "the chains must span several chunks of 2"
    k = {"first": 0, "middle": len(order) // 2, "last": len(order) - 1}[position]
    _forge(order[k])
    checked, broken = ledger_verify(chunk_size=2)
    assert broken is not None and broken.entry_id == order[k]
    assert "changed" in broken.problem
    assert checked == k + 1


def test_progress_is_reported_every_n_entries_and_at_the_end(team):
    _three_runs(team)
    total = LedgerEntry.objects.count()
    seen: list[VerifyProgress] = []
    checked, broken = ledger_verify(progress=seen.append, progress_every=2, chunk_size=3)
    assert broken is None and checked == total
    assert [p.checked for p in seen if not p.done] == list(range(2, total + 1, 2))
    assert seen[-1].done and seen[-1].checked == total
    assert all(p.rate >= 0 for p in seen)


def test_the_command_prints_progress_lines_with_a_rate(team, capsys):
    _three_runs(team)
    total = LedgerEntry.objects.count()
    call_command("verify_ledger", "--progress-every", "2")
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("verified ")]
    assert len(lines) == total // 2
    assert all("entries/s" in line for line in lines)
    assert f"ledger OK: {total} entries verified" in out
