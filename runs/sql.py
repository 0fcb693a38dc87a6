"""Statements built once per process from the models' `_meta`, for the hottest write paths.

Compiling the same ORM statement again on every call was most of a stop's CPU time, which is
what bounds a bulk stop of 1,000 runs (docs/BENCHMARKS.md). What is built here
names every concrete column with Django's own defaults and value preparation, so a column that a
migration adds is written too. PostgreSQL only (`prepared_statements`): the callers keep their
ORM path for SQLite, the embedded database of `make run`.

An instance written by `insert` goes through no `pre_save`/`post_save` signal: use it only for
models no receiver listens to (StopRequest, LedgerEntry).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, models

Converter = Callable[[Any, Any, Any], Any]


def prepared_statements() -> bool:
    """Whether the statements of this module (PostgreSQL SQL) serve this database."""
    return connection.vendor == "postgresql"


def field_of(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, models.Field)  # a concrete column, not a reverse relation
    return field


def quoted(field: models.Field[Any, Any]) -> str:
    assert field.column is not None
    return connection.ops.quote_name(field.column)


def table(model: type[models.Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[models.Model], name: str) -> str:
    return quoted(field_of(model, name))


def insert_fields(model: type[models.Model]) -> list[models.Field[Any, Any]]:
    return [field for field in model._meta.concrete_fields if not field.primary_key]


@functools.cache
def insert_statement(model: type[models.Model]) -> str:
    """INSERT of every concrete column but the primary key, RETURNING the primary key."""
    fields = insert_fields(model)
    return (
        f"INSERT INTO {table(model)} ({', '.join(quoted(field) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quoted(model._meta.pk)}"
    )


def insert_params(instance: models.Model) -> list[Any]:
    """The values `insert_statement` takes, prepared as `Model.save` prepares them."""
    return [
        field.get_db_prep_save(field.pre_save(instance, True), connection)
        for field in insert_fields(type(instance))
    ]


def saved_as(instance: models.Model, pk: Any) -> None:
    """Mark an instance inserted by hand as Django marks one it saved."""
    instance.pk = pk
    instance._state.adding = False
    instance._state.db = connection.alias


def insert(instance: models.Model) -> None:
    """Insert one new instance in one statement, and set its primary key."""
    with connection.cursor() as cursor:
        cursor.execute(insert_statement(type(instance)), insert_params(instance))
        row = cursor.fetchone()
    saved_as(instance, row[0])


@functools.cache
def _converters(model: type[models.Model]) -> list[tuple[Any, list[Converter]]]:
    """Per concrete field, what turns a database value into the Python one (a JSON column's
    text into a dict, …): the same converters, with the same column, as the ORM's compiler."""
    converters = []
    for field in model._meta.concrete_fields:
        col = field.get_col(model._meta.db_table)
        converters.append(
            (col, [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)])
        )
    return converters


def select_columns(model: type[models.Model]) -> str:
    """Every concrete column of the model, qualified with its table, in `from_row`'s order."""
    return ", ".join(f"{table(model)}.{quoted(field)}" for field in model._meta.concrete_fields)


def from_row(model: type[models.Model], values: Sequence[Any]) -> Any:
    """A model instance from the values of `select_columns(model)`, as the ORM would make it."""
    converted = []
    for value, (col, field_converters) in zip(values, _converters(model), strict=True):
        for convert in field_converters:
            value = convert(value, col, connection)
        converted.append(value)
    names = [field.attname for field in model._meta.concrete_fields]
    return model.from_db(connection.alias, names, converted)
