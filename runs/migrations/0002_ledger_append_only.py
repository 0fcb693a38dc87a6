"""The ledger is append-only: a trigger refuses UPDATE and DELETE, on PostgreSQL and SQLite."""

from __future__ import annotations

from django.db import migrations

PG_INSTALL = """
CREATE OR REPLACE FUNCTION safestop_ledger_refuse_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'safestop ledger is append-only: % refused on entry %', TG_OP, OLD.id
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS safestop_ledger_append_only ON runs_ledgerentry;
CREATE TRIGGER safestop_ledger_append_only BEFORE UPDATE OR DELETE ON runs_ledgerentry
    FOR EACH ROW EXECUTE FUNCTION safestop_ledger_refuse_change();
"""
PG_REMOVE = """
DROP TRIGGER IF EXISTS safestop_ledger_append_only ON runs_ledgerentry;
DROP FUNCTION IF EXISTS safestop_ledger_refuse_change();
"""
SQLITE_INSTALL = [
    """CREATE TRIGGER IF NOT EXISTS safestop_ledger_no_update BEFORE UPDATE ON runs_ledgerentry
       BEGIN SELECT RAISE(ABORT, 'safestop ledger is append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER IF NOT EXISTS safestop_ledger_no_delete BEFORE DELETE ON runs_ledgerentry
       BEGIN SELECT RAISE(ABORT, 'safestop ledger is append-only: DELETE refused'); END;""",
]
SQLITE_REMOVE = [
    "DROP TRIGGER IF EXISTS safestop_ledger_no_update;",
    "DROP TRIGGER IF EXISTS safestop_ledger_no_delete;",
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
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_REMOVE, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_REMOVE:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]
    operations = [migrations.RunPython(install, remove)]
