"""The runs page over a million runs (docs/BENCHMARKS.md).

Two b-tree indexes the capped per-state counts read index-only (per team, per agent) and the
agent list walks. On PostgreSQL, trigram indexes let a search of the titles (Django's
`icontains`: `UPPER(title) LIKE UPPER('%…%')`) and of id fragments (`id LIKE '%…%'`) find the
matching rows without reading every run; SQLite (`make run`) has no pg_trgm and keeps its scan.
"""

from django.db import migrations, models

TRIGRAM_INDEXES = (
    # The expressions are the ones Django's lookups write, or PostgreSQL would not use them.
    ("run_title_trgm_idx", "(UPPER(title::text)) gin_trgm_ops"),
    ("run_id_trgm_idx", "(id::text) gin_trgm_ops"),
)


def create_trigram_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for name, expression in TRIGRAM_INDEXES:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON runs_run USING gin ({expression})"
        )


def drop_trigram_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _expression in TRIGRAM_INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0006_bulk_stop"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["team", "status", "-created_at"], name="run_team_status_created_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["agent", "status", "team"], name="run_agent_status_team_idx"
            ),
        ),
        migrations.RunPython(create_trigram_indexes, drop_trigram_indexes),
    ]
