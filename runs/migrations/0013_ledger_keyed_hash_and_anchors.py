"""The ledger's keyed hash and anchors (runs/ledger.py, runs/ledger_anchors.py), and a trigger
that refuses TRUNCATE of the ledger on PostgreSQL.

Entries already written keep their plain hash and are marked so (`hash_version` 1): an existing
database still verifies. On SQLite, adding a NOT NULL column remakes the table, which drops the
append-only triggers of 0002_ledger_append_only: they are made again here. SQLite has no TRUNCATE.
"""

from __future__ import annotations

from django.db import migrations, models

PG_INSTALL = """
CREATE OR REPLACE FUNCTION safestop_ledger_refuse_truncate() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'safestop ledger is append-only: TRUNCATE refused'
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS safestop_ledger_no_truncate ON runs_ledgerentry;
CREATE TRIGGER safestop_ledger_no_truncate BEFORE TRUNCATE ON runs_ledgerentry
    FOR EACH STATEMENT EXECUTE FUNCTION safestop_ledger_refuse_truncate();
"""
PG_REMOVE = """
DROP TRIGGER IF EXISTS safestop_ledger_no_truncate ON runs_ledgerentry;
DROP FUNCTION IF EXISTS safestop_ledger_refuse_truncate();
"""
SQLITE_INSTALL = [
    """CREATE TRIGGER IF NOT EXISTS safestop_ledger_no_update BEFORE UPDATE ON runs_ledgerentry
       BEGIN SELECT RAISE(ABORT, 'safestop ledger is append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER IF NOT EXISTS safestop_ledger_no_delete BEFORE DELETE ON runs_ledgerentry
       BEGIN SELECT RAISE(ABORT, 'safestop ledger is append-only: DELETE refused'); END;""",
]


def install(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_INSTALL, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_INSTALL:
            schema_editor.execute(statement)
    else:
        raise RuntimeError(f"no append-only ledger trigger for database vendor {vendor!r}")


def remove(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REMOVE, params=None)


class Migration(migrations.Migration):
    dependencies = [("runs", "0012_bulk_stop_preview")]

    operations = [
        migrations.AddField(
            model_name="ledgerentry",
            name="hash_version",
            # Every row written before this migration has the plain hash.
            field=models.PositiveSmallIntegerField(default=1),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="ledgerentry",
            name="key_id",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.AddField(
            model_name="ledgerverification",
            name="anchored_heads",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="ledgerverification",
            name="anchor_written",
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name="ledgerverification",
            name="anchor_error",
            field=models.TextField(blank=True),
        ),
        migrations.RunPython(install, remove),
    ]
