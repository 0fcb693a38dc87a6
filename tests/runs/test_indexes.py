"""The busy child tables carry no index that only costs writes (docs/BENCHMARKS.md, stop).

A run's stop freezes every pending outbox item in one UPDATE; a status change is never a HOT
update (the dispatcher's partial indexes have `status` in their predicate), so every index of
`runs_outboxitem` takes a write per frozen item. Django would give each `run` FK two indexes
(run_id and its varchar_pattern_ops twin) that the (run, ...) unique indexes make redundant.
"""

from __future__ import annotations

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db


def _indexes(table: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        return dict(cursor.fetchall())


@pytest.fixture(autouse=True)
def _postgresql_only() -> None:
    if connection.vendor != "postgresql":
        pytest.fail("index layout is asserted on PostgreSQL (make test provides it)")


def test_a_frozen_outbox_item_writes_two_index_entries_not_five() -> None:
    indexes = _indexes("runs_outboxitem")
    assert set(indexes) == {
        "runs_outboxitem_pkey",
        "outbox_unique_run_key",
        "outbox_pending_idx",
        "outbox_dispatching_idx",
        "outbox_exec_record_idx",
        "outbox_unconfirmed_idx",
        "outbox_pending_run_idx",
        "outbox_released_idx",
    }
    # The six partial indexes take no entry for a frozen item without an execution record.
    for name in ("outbox_pending_idx", "outbox_pending_run_idx"):
        assert "WHERE" in indexes[name] and "'pending'" in indexes[name], indexes[name]
    assert (
        "WHERE" in indexes["outbox_released_idx"] and "'released'" in indexes["outbox_released_idx"]
    )
    assert (
        "WHERE" in indexes["outbox_exec_record_idx"]
        and "IS NOT NULL" in indexes["outbox_exec_record_idx"]
    )
    unconfirmed = indexes["outbox_unconfirmed_idx"]
    assert "WHERE" in unconfirmed and "'dispatching'" in unconfirmed
    assert "'frozen'" not in unconfirmed and "'pending'" not in unconfirmed


@pytest.mark.parametrize(
    "table",
    [
        "runs_step",
        "runs_eventreceipt",
        "runs_executionrecord",
        "runs_artifact",
        "runs_checkpoint",
        "runs_outboxitem",
    ],
)
def test_no_child_table_keeps_a_pattern_ops_twin_of_run_id(table: str) -> None:
    assert [
        name for name, definition in _indexes(table).items() if "varchar_pattern_ops" in definition
    ] == []


def test_every_run_id_lookup_still_has_an_index_that_leads_with_run_id() -> None:
    for table in (
        "runs_step",
        "runs_eventreceipt",
        "runs_executionrecord",
        "runs_artifact",
        "runs_checkpoint",
        "runs_outboxitem",
    ):
        assert any("(run_id" in definition for definition in _indexes(table).values()), table
