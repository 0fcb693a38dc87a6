"""Statements built once per process from the models' `_meta`, for the hottest write paths.

Compiling the same ORM statement again on every call was most of a stop's CPU time, which is
what bounds a bulk stop of 1,000 runs (docs/BENCHMARKS.md). What is built here
names every concrete column with Django's own defaults and value preparation, so a column that a
migration adds is written too. PostgreSQL only (`prepared_statements`): the callers keep their
ORM path for SQLite, the embedded database of `make run`.

An instance written by `insert` goes through no `pre_save`/`post_save` signal: use it only for
models no receiver listens to (StopRequest, LedgerEntry). `save_fields` asks: a model with a
receiver is saved by the ORM.

Each statement is also prepared on its connection the first time it is sent (`cursor`):
PostgreSQL parses and plans it once per connection, not once per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.signals import post_save, pre_save
from django.db.transaction import TransactionManagementError
from psycopg.pq import ExecStatus

Converter = Callable[[Any, Any, Any], Any]


def prepared_statements() -> bool:
    """Whether the statements of this module (PostgreSQL SQL) serve this database."""
    return connection.vendor == "postgresql"


def cursor(db: BaseDatabaseWrapper | None = None) -> Any:
    """A cursor for this module's statements: its parameters bound by the server (psycopg's
    `Cursor`), not spliced into the text as the ORM's cursors do, so that psycopg prepares each
    statement on its connection the first time it is sent (`prepare_threshold`,
    console/settings.py) and PostgreSQL neither parses nor plans it again. Parsing and planning
    were most of PostgreSQL's own CPU in a permit and in a result (2.2-2.7 ms each, 1.1-1.2 ms
    prepared), which the caller waits for with the run row locked (docs/BENCHMARKS.md). Wrapped
    as `connection.cursor()` wraps the ORM's: the same execute wrappers, the same query log.
    `db`: this thread's connection, when the caller has it at hand."""
    if db is None:
        db = connections[DEFAULT_DB_ALIAS]
    db.close_if_health_check_failed()
    db.ensure_connection()
    with db.wrap_database_errors:
        return db._prepare_cursor(  # type: ignore[attr-defined]
            _bound_cursor_class()(db.connection)
        )


@functools.cache
def _bound_cursor_class() -> type:
    # The PostgreSQL backend's module, loaded only where it serves (not under SQLite).
    from django.db.backends.postgresql.base import ServerBindingCursor

    class BoundCursor(ServerBindingCursor):  # type: ignore[misc,valid-type]
        def _send_query_prepared(self, name: bytes, pgq: Any, **kwargs: Any) -> None:
            # psycopg keeps the statement only when it sends its text: Django's query log
            # (`last_executed_query`) reads it from there.
            self._query = pgq
            super()._send_query_prepared(name, pgq, **kwargs)  # type: ignore[misc]

    return BoundCursor


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
    with cursor() as bound:
        bound.execute(insert_statement(type(instance)), insert_params(instance))
        row = bound.fetchone()
    saved_as(instance, row[0])


def create(instance: models.Model) -> None:
    """`instance.save(force_insert=True)` with its INSERT built once (`insert`); a model a signal
    receiver listens to, or a database other than PostgreSQL, goes through `save` itself."""
    if _saved_by_the_orm(type(instance)):
        instance.save(force_insert=True)
    else:
        insert(instance)


def _saved_by_the_orm(model: type[models.Model]) -> bool:
    return (
        not prepared_statements() or pre_save.has_listeners(model) or post_save.has_listeners(model)
    )


@functools.cache
def update_statement(model: type[models.Model], names: tuple[str, ...]) -> str:
    """UPDATE of the named columns of one row, found by its primary key."""
    assignments = ", ".join(f"{column(model, name)} = %s" for name in names)
    return f"UPDATE {table(model)} SET {assignments} WHERE {quoted(model._meta.pk)} = %s"


def save_fields(instance: models.Model, names: Sequence[str]) -> None:
    """`instance.save(update_fields=names)` with its UPDATE built once per model and list of
    fields: the same values, prepared as `Model.save` prepares them (an `auto_now` column takes
    the time now). Every transition saves the run and its lease or stop request this way, and
    compiling those UPDATEs again each time was a third of a drained answer's CPU
    (docs/BENCHMARKS.md). A model a signal receiver listens to, or a database other than
    PostgreSQL, goes through `save` itself."""
    model = type(instance)
    if _saved_by_the_orm(model):
        instance.save(update_fields=list(names))
        return
    with cursor() as bound:
        bound.execute(update_statement(model, tuple(names)), _save_params(instance, names))
        updated = bound.rowcount
    if updated == 0:
        _not_saved()


def _save_params(instance: models.Model, names: Sequence[str]) -> list[Any]:
    model = type(instance)
    params = [
        field_of(model, name).get_db_prep_save(
            field_of(model, name).pre_save(instance, False), connection
        )
        for name in names
    ]
    params.append(model._meta.pk.get_db_prep_value(instance.pk, connection))
    return params


def _not_saved() -> None:
    raise DatabaseError("Save with update_fields did not affect any rows.")  # as `Model.save`


def _saved_one(rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        _not_saved()


class Deferred:
    """Writes held back to be sent in one round trip with the statements after them.

    A transition holds the run lock while each of its statements waits on its round trip, and
    most of its writes depend on nothing it reads next: they can go at the head of its next
    pipeline (`pipelined`, which runs them in order, each seeing what the ones before wrote).
    `save_fields` and `add` hold a write back; `pipelined` sends what is held, then the
    statements given, and answers for those only; `send` sends what is held. A write that must
    go through the ORM (SQLite, a model with a signal receiver) is made at once: the order of
    the writes within the transaction is all that changes, and nothing in between reads them.
    """

    def __init__(self) -> None:
        self._held: list[tuple[tuple[str, list[Any]], Callable[[list[Any]], None] | None]] = []

    def add(
        self, statement: tuple[str, list[Any]], then: Callable[[list[Any]], None] | None = None
    ) -> None:
        """Hold `statement` back; `then` is called with its rows once it is sent."""
        self._held.append((statement, then))

    def save_fields(self, instance: models.Model, names: Sequence[str]) -> None:
        """`save_fields(instance, names)`, held back; its values are taken now."""
        model = type(instance)
        if _saved_by_the_orm(model):
            instance.save(update_fields=list(names))
            return
        statement = update_statement(model, tuple(names))
        returning = f"{statement} RETURNING {quoted(model._meta.pk)}"  # no row: not saved
        self.add((returning, _save_params(instance, names)), then=_saved_one)

    def pipelined(self, *statements: tuple[str, list[Any]]) -> list[list[tuple[Any, ...]]]:
        held, self._held = self._held, []
        if not held and not statements:
            return []
        if not held:
            return pipelined(*statements)
        fetched = pipelined(*(statement for statement, _then in held), *statements)
        for (_statement, then), rows in zip(held, fetched, strict=False):
            if then is not None:
                then(rows)
        return fetched[len(held) :]

    def send(self) -> None:
        self.pipelined()


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


class OnceCompiled:
    """An ORM read compiled once per process; each call binds its own arguments.

    `build(*args)` makes a `.values(...)` queryset. It is built and compiled once, with
    `samples`: distinctive values of the arguments' types, which are then looked for among the
    compiled parameters, so each call puts its own arguments in their places and sends the
    very SQL the ORM would. Rows come back as the ORM's `.values()` dicts, converted by the
    ORM's own converters (a JSON column's text into a dict, …). Compiling was most of the CPU
    time of a drained answer's stop packet (docs/BENCHMARKS.md). On a database other than
    PostgreSQL (`prepared_statements`) each call runs `build(*args)` through the ORM.
    """

    def __init__(self, build: Callable[..., Any], *samples: Any) -> None:
        self._build = build
        self._samples = samples
        self._compiled: tuple[str, list[Any], list[str], dict[int, Any]] | None = None

    def _compile(self) -> tuple[str, list[Any], list[str], dict[int, Any]]:
        queryset = self._build(*self._samples)
        query = queryset.query
        compiler = query.get_compiler(connection=connection)
        statement, params = compiler.as_sql()
        bound: list[Any] = []
        found: set[int] = set()
        for param in params:
            slot = next(
                (
                    index
                    for index, sample in enumerate(self._samples)
                    # The backend may wrap a value (an int as psycopg's Int4): kept per call.
                    if isinstance(param, type(sample)) and param == sample
                ),
                None,
            )
            if slot is not None:
                found.add(slot)
            bound.append(_Slot(slot, type(param)) if slot is not None else param)
        if len(found) != len(self._samples):
            raise AssertionError(f"an argument of {statement!r} is not a parameter of its SQL")
        names = [*query.extra_select, *query.values_select, *query.annotation_select]
        fields = [column[0] for column in compiler.select[: compiler.col_count]]
        return statement, bound, names, compiler.get_converters(fields)

    def rows(self, *args: Any) -> list[dict[str, Any]]:
        if not prepared_statements():
            return list(self._build(*args))
        with cursor() as bound:
            bound.execute(*self.statement(*args))
            fetched = bound.fetchall()
        return self.converted(fetched)

    def statement(self, *args: Any) -> tuple[str, list[Any]]:
        """The SQL and its parameters for these arguments (PostgreSQL), for `pipelined`."""
        if self._compiled is None:
            self._compiled = self._compile()
        statement, bound, _names, _converters = self._compiled
        return statement, [item.bind(args) if isinstance(item, _Slot) else item for item in bound]

    def converted(self, fetched: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        """`rows`' answer from the rows the statement fetched."""
        assert self._compiled is not None
        _statement, _bound, names, converters = self._compiled
        rows = []
        for values in fetched:
            row = list(values)
            for position, (field_converters, expression) in converters.items():
                value = row[position]
                for convert in field_converters:
                    value = convert(value, expression, connection)
                row[position] = value
            rows.append(dict(zip(names, row, strict=True)))
        return rows


class OnceCompiledInstance(OnceCompiled):
    """The first row of an ORM read compiled once per process, as a model instance (every
    concrete column, converted as the ORM converts it), or None: a `.first()` without the
    compiling. `build(*args)` makes the queryset, filtered and ordered."""

    def __init__(self, model: type[models.Model], build: Callable[..., Any], *samples: Any):
        self._model = model
        self._names = [field.attname for field in model._meta.concrete_fields]
        super().__init__(lambda *args: build(*args).values(*self._names)[:1], *samples)

    def first(self, *args: Any) -> Any:
        return self.instance(self.rows(*args))

    def instance(self, rows: list[dict[str, Any]]) -> Any:
        """The model instance of `rows`' first, or None."""
        if not rows:
            return None
        row = rows[0]
        return self._model.from_db(connection.alias, self._names, [row[n] for n in self._names])


def pipelined(
    *statements: tuple[str, list[Any]], commit: bool = False
) -> list[list[tuple[Any, ...]]]:
    """Each statement's rows, the statements sent in one round trip (PostgreSQL's pipeline
    mode, which runs them in order, each seeing what the ones before it wrote): a transition
    holds the run lock while its statements wait on their round trips.

    `commit`: these are the transaction's last statements; its COMMIT goes in the same round
    trip when the transaction allows it (`_commits_with_last_pipeline`). Nothing may run on the
    connection after them until the transaction's block ends (`_refuse_statements_after_commit`)."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each `connection.x` looks the thread's up again
    with ExitStack() as cursors:
        opened = [cursors.enter_context(cursor(db)) for _ in statements]
        with db.wrap_database_errors:
            with pipeline(db, commit=commit):
                for each, (statement, params) in zip(opened, statements, strict=True):
                    each.execute(statement, params)
            # The pipeline's end waited for every result: each cursor holds its own now.
            return [_fetched(each) for each in opened]


@contextmanager
def pipeline(db: BaseDatabaseWrapper, *, commit: bool = False) -> Iterator[None]:
    """`db`'s psycopg pipeline; with `commit`, the statements sent in it are the transaction's
    last, and its COMMIT goes at the pipeline's end when the transaction allows it
    (`_commits_with_last_pipeline`). Read the cursors' rows once the block has ended: a fetch
    inside it waits for a round trip of its own (a flush) before the pipeline's sync."""
    folded = commit and _commits_with_last_pipeline(db)
    with db.connection.pipeline():
        yield
        if folded:
            _send_commit(db)
    if folded:
        _refuse_statements_after_commit(db)


def _commits_with_last_pipeline(db: BaseDatabaseWrapper) -> bool:
    """Whether a transition's last pipeline may carry its transaction's COMMIT: on PostgreSQL,
    in the outermost block of a durable `transaction.atomic` (not a savepoint, not a test's
    wrapping transaction), with no error met.

    Why it is safe: PostgreSQL runs a pipeline's statements in order and skips every one after
    a failed one until the pipeline's end, so a failed write is never followed by the COMMIT;
    the error reaches `atomic`, which rolls back as before. A COMMIT that succeeded leaves the
    connection idle: `atomic`'s own commit is then a no-op in psycopg (`Connection.commit`
    sends nothing outside a transaction), and its on-commit hooks run as before. This saves a
    round trip on which the run lock is held, in every permit, result and single event."""
    return (
        db.vendor == "postgresql"
        and db.in_atomic_block
        and len(db.atomic_blocks) == 1
        and getattr(db.atomic_blocks[0], "durable", False)  # not in django-stubs
        and not db.needs_rollback
        and not db.savepoint_ids
    )


def _send_commit(db: BaseDatabaseWrapper) -> None:
    # Django's own cursor binds on the client: COMMIT is not prepared on the connection.
    with db.cursor() as plain:
        plain.execute("COMMIT")


class StatementAfterCommit(TransactionManagementError):
    """A statement was sent in a transaction block whose COMMIT already went with its last
    pipeline: it would have run in a transaction of its own."""


def _refuse_statements_after_commit(db: BaseDatabaseWrapper) -> None:
    """Until the committed block ends, a statement on this connection raises instead of
    silently starting a second transaction that `atomic` would then commit. Every caller of
    `pipelined(commit=True)` is tested for sending nothing after; this keeps it so."""
    block = db.atomic_blocks[0]

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if db.atomic_blocks and db.atomic_blocks[0] is block:
            raise StatementAfterCommit(
                f"{sql[:80]!r} was sent after its transaction's COMMIT (sql.pipelined(commit=True))"
            )
        _forget(refuse)  # the block ended without its on-commit hooks (an error after COMMIT)
        return execute(sql, params, many, context)

    def _forget(wrapper: Any) -> None:
        if wrapper in db.execute_wrappers:
            db.execute_wrappers.remove(wrapper)

    # First in the list: `connection.execute_wrapper(...)` blocks pop their own from its end.
    db.execute_wrappers.insert(0, refuse)
    db.on_commit(lambda: _forget(refuse))


def rows_of_each(
    *reads: tuple[OnceCompiled, tuple[Any, ...]], after: Deferred | None = None
) -> list[list[dict[str, Any]]]:
    """`read.rows(*args)` of each, in one round trip on PostgreSQL (`pipelined`), after the
    writes `after` holds back (sent in the same round trip)."""
    if not prepared_statements():
        if after is not None:
            after.send()
        return [read.rows(*args) for read, args in reads]
    statements = [read.statement(*args) for read, args in reads]
    fetched = after.pipelined(*statements) if after is not None else pipelined(*statements)
    return [read.converted(rows) for (read, _args), rows in zip(reads, fetched, strict=True)]


def _fetched(done: Any) -> list[tuple[Any, ...]]:
    # A statement that returns no rows (an UPDATE) has no result to fetch. Asked of the result
    # itself, as psycopg's `description` does, without building the `Column` objects each
    # access of `description` makes (a tenth of a drained answer's CPU, an eighth of a
    # permit's: the run lock answers about sixty columns).
    result = done.pgresult
    if result is None or not (result.nfields or result.status == ExecStatus.TUPLES_OK):
        return []
    return done.fetchall()


class _Slot:
    """Where a call's argument goes among a once-compiled statement's parameters."""

    __slots__ = ("index", "wrap")

    def __init__(self, index: int, wrap: type) -> None:
        self.index = index
        self.wrap = wrap

    def bind(self, args: tuple[Any, ...]) -> Any:
        value = args[self.index]
        return value if type(value) is self.wrap else self.wrap(value)
