"""Fixed-shape reads of the hot paths, compiled by the ORM once and run again with new values.

Django builds and compiles a QuerySet's SQL every time one is evaluated. On the paths an
agent pays on every call (its session read with agent, owner, profile and grants; the
chain-head lock of each audit append; the call read again after its wake-up; the worker's
claim and result) that is most of a read's CPU: far more than the statement and its rows
(docs/benchmarks.md, "Where S0's time goes", has the figures).

`Compiled(build)` compiles `build(*values)` once per database and per shape of its
arguments (a list's length is part of its shape), with placeholder values, and keeps the
ORM's own SQL, column layout, converters and select_related layout. Each run substitutes
the real values and builds the rows exactly as the QuerySet would: same model instances,
same related objects, same annotations. The statement goes through the connection's
cursor, so query logging, execute wrappers and the statement budgets of the tests see it.

Only reads whose SQL depends on nothing but their arguments qualify. Every value the
statement is built with must come from an argument (a clock reading included: pass `now`
in), which is checked when the read is compiled: a value the builder made up itself (a
date, an id, a text derived from an argument) is an error there, never a frozen value
in every later run. Arguments may be str, int, UUID, aware datetime, or a list of those (an empty list
matches nothing, as in the ORM, without a query).

Verified against Django 6.1 and psycopg 3.3 (`VERIFIED_WITH`): it reads the ORM's compiler
output and the cursor wrappers' internals, so another line of either is checked again before
use (dispatcher.W015 names the difference at start-up).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from weakref import ref as weak_ref

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, models, transaction
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import NOT_PROVIDED, Field, Model, QuerySet, signals
from django.db.models.query import get_related_populators
from django.db.transaction import TransactionManagementError
from django.utils.asyncio import async_unsafe

M = TypeVar("M", bound=Model)

# --- Prepared statements -----------------------------------------------------------------

# The library lines this module was verified against (dispatcher.W015).
VERIFIED_WITH = {"Django": "6.1", "psycopg": "3.3"}


@async_unsafe
def fixed_cursor(using: str = DEFAULT_DB_ALIAS, *, prepare: bool | None = True) -> CursorWrapper:
    """The connection's cursor, for statements whose text is built once (the compiled
    reads, the transitions' writes, the audit appends, the decision's row).

    On PostgreSQL (psycopg 3) with HARNESS_DB_PREPARE on, its statements are bound on the
    server and prepared: PostgreSQL parses and plans each text once per connection, then
    only binds and executes it (planning was most of its CPU per call: docs/benchmarks.md).
    `prepare=True` prepares at the first run: for statements of a few texts. `None` leaves
    it to psycopg's count (the fifth run of the same text with the same parameter types):
    for statements whose text or types vary with their rows (an INSERT of N rows, each
    NULL a type of its own), which would otherwise fill the connection's cache of prepared
    statements (100) with statements run once. Anywhere else, Django's cursor as it is
    (client-side binding, nothing prepared, as Django sets psycopg up for poolers).

    Either way it is Django's cursor wrapper, so query logging, execute wrappers, error
    translation and the statement budgets of the tests see every statement.
    """
    connection = connections[using]
    if connection.vendor != "postgresql" or not settings.HARNESS_DB_PREPARE:
        return connection.cursor()
    # What connection.cursor() does (BaseDatabaseWrapper._cursor), with this cursor in
    # place of the one it would open (and this one would then replace).
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    # (psycopg prepares nothing with no threshold: settings set one; a settings module of
    # its own may not)
    if getattr(connection.connection, "prepare_threshold", None) is None:
        return connection.cursor()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        preparing = _preparing_class().open(connection, prepare)
    if connection.queries_logged:
        return _LoggedPreparingCursor(preparing, connection)
    return CursorWrapper(preparing, connection)


class _LoggedPreparingCursor(CursorDebugWrapper):
    """What Django's debug cursor logs for a server-binding one (the statement with its
    values, as with `server_side_binding`)."""

    def execute(self, sql: Any, params: Any = None) -> Any:
        with self.db.wrap_database_errors:
            logged = self.db.ops.compose_sql(sql, params) if params is not None else sql
        with self.debug_sql(logged, params):
            return self._execute_with_wrappers(sql, params, many=False, executor=self._execute)


# What PostgreSQL says when a prepared statement's result columns changed type (a
# migration altered a column it reads).
STALE_PLAN = "cached plan must not change result type"


@functools.cache
def _preparing_class() -> type[Any]:
    """Django's server-binding cursor, preparing what it executes (made on first use: it
    exists only where psycopg 3 is installed; its imports and lookups are done once here,
    not per statement)."""
    import psycopg
    from django.db.backends.postgresql import base, psycopg_any
    from psycopg.pq import Format, TransactionStatus

    server_binding: Any = base.ServerBindingCursor
    timestamptz = psycopg.adapters.types["timestamptz"].oid

    class PreparingCursor(server_binding):  # type: ignore[misc]
        harness_prepare: bool | None = True

        @classmethod
        def open(cls, connection: Any, prepare: bool | None) -> Any:
            """One on `connection` (Django's), with the time zone's loader Django's own
            cursors get."""
            raw = cls(connection.connection)
            raw.harness_prepare = prepare
            loader = connection.connection.adapters.get_loader(timestamptz, Format.TEXT)
            if connection.timezone != loader.timezone:
                psycopg_any.register_tzloader(connection.timezone, raw)
            return raw

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare", self.harness_prepare)
            try:
                return super().execute(query, params, **kwargs)
            except psycopg.errors.FeatureNotSupported as error:
                if error.diag.message_primary != STALE_PLAN:
                    raise
                # A migration changed a column this connection's statements read: forget
                # them all, here and on the server (psycopg itself forgets them only on a
                # rollback). Outside a transaction, run the statement again (prepared
                # anew); inside one, the transaction has failed: its rollback is the
                # caller's, and the next statement prepares anew.
                conn = self.connection
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    raise
                conn._prepared.clear()
                conn.wait(conn._prepared.maintain_gen(conn))  # DEALLOCATE ALL, now
                return super().execute(query, params, **kwargs)

    return PreparingCursor


# Constants the ORM may bind itself (a status literal, a flag); anything else must come
# from an argument.
_CONSTANT_TYPES = (bool, int, float, str, type(None))


class NotCompilable(ValueError):
    """The read's SQL depends on something other than its arguments."""


def _sentinel(value: object, serial: int) -> object:
    """A placeholder of `value`'s type that nothing else in a statement can equal."""
    if isinstance(value, bool):
        raise NotCompilable("a bool argument cannot be told apart from a constant")
    if isinstance(value, str):
        return f"\x1fcompiled:{serial}\x1f"
    if isinstance(value, int):
        # Within a 32-bit integer column's range: Django answers a lookup with a value out
        # of the column's range with no query at all (EmptyResultSet), not a statement.
        return 1_900_000_003 + serial * 7919
    if isinstance(value, uuid.UUID):
        return uuid.UUID(int=(0xC0_41_1E_D0 << 96) + serial)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return dt.datetime(1999, 12, 31, 23, 58, 0, serial + 1, tzinfo=dt.UTC)
    raise NotCompilable(f"unsupported argument type {type(value).__name__}")


@dataclass(frozen=True)
class _Slot:
    """Where an argument goes among the statement's parameters, and how it is bound."""

    arg: int  # index into the flattened arguments
    bind: str  # "same", "hex" (a UUID on a backend without a uuid type), "datetime"


@dataclass
class _Plan:
    sql: str
    slots: list[_Slot | None]  # None: a constant, kept from the compile
    constants: list[object]
    compiler: Any  # the ORM's compiler after its one compile (columns, converters, layout)
    for_update: bool
    db: str
    fetch_mode: Any  # the QuerySet's (Django's FETCH_ONE unless the builder chose another)
    # The columns' converters, found once (results_iter finds them again for every run);
    # None when a composite column needs the ORM's own reshaping.
    converters: list[tuple[int, tuple[list[Any], Any]]] | None = None

    def convert(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """The rows as the ORM's results_iter(tuple_expected=True) gives them."""
        compiler = self.compiler
        if self.converters is None:
            return list(compiler.results_iter(results=[rows], tuple_expected=True))
        if not self.converters:
            return rows
        connection = compiler.connection
        out = []
        for row in rows:
            values = list(row)
            for position, (functions, expression) in self.converters:
                value = values[position]
                for function in functions:
                    value = function(value, expression, connection)
                values[position] = value
            out.append(tuple(values))
        return out

    def params(self, flat: list[object]) -> list[Any]:
        out: list[Any] = []
        for slot, constant in zip(self.slots, self.constants, strict=True):
            if slot is None:
                out.append(constant)
                continue
            value = flat[slot.arg]
            if slot.bind == "hex":
                value = value.hex  # type: ignore[attr-defined]
            elif slot.bind == "datetime":
                value = _adapt_datetime(value, self.db)
            out.append(value)
        return out


def _adapt_datetime(value: Any, db: str) -> object:
    return connections[db].ops.adapt_datetimefield_value(value)


def _flatten(values: Sequence[object]) -> tuple[list[object], tuple[object, ...]]:
    """The arguments one by one (lists spread out), and the shape a plan is kept under."""
    flat: list[object] = []
    shape: list[object] = []
    for value in values:
        if isinstance(value, list | tuple):
            flat.extend(value)
            shape.append(("list", tuple(type(v).__name__ for v in value)))
        else:
            flat.append(value)
            shape.append(type(value).__name__)
    return flat, tuple(shape)


def _rebuild(values: Sequence[object], sentinels: list[object]) -> list[object]:
    """`values` with every argument replaced by its placeholder (lists kept as lists)."""
    it = iter(sentinels)
    return [[next(it) for _ in v] if isinstance(v, list | tuple) else next(it) for v in values]


def _bind_of(param: object, sentinel: object, db: str) -> str | None:
    if type(param) is type(sentinel) and param == sentinel:
        return "same"
    if isinstance(sentinel, uuid.UUID) and param == sentinel.hex:
        return "hex"
    if isinstance(sentinel, dt.datetime) and param == _adapt_datetime(sentinel, db):
        return "datetime"
    return None


# A date or an id as text (SQLite binds datetimes and UUIDs as strings): never a constant.
_MADE_UP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d|[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-")


def _looks_made_up(param: object) -> bool:
    return isinstance(param, str) and _MADE_UP.search(param) is not None


def _mentions(param: object, sentinels: list[object]) -> bool:
    """Whether a constant was derived from an argument (a LIKE pattern, a cast text)."""
    if not isinstance(param, str):
        return False
    for s in sentinels:
        forms = [s.hex, str(s)] if isinstance(s, uuid.UUID) else [str(s)]
        if any(form in param for form in forms):
            return True
    return False


class Compiled(Generic[M]):  # noqa: UP046 (mypy and django-stubs read the TypeVar form)
    """A read built by `build(*values)`, compiled once per database and argument shape."""

    def __init__(self, build: Callable[..., QuerySet[M, Any]]) -> None:
        self._build = build
        self._plans: dict[tuple[str, tuple[object, ...]], _Plan] = {}
        self._lock = threading.Lock()

    def _plan(self, db: str, values: Sequence[object]) -> tuple[_Plan, list[object]]:
        flat, shape = _flatten(values)
        plan = self._plans.get((db, shape))
        if plan is None:
            with self._lock:
                plan = self._plans.get((db, shape)) or self._compile(db, values, flat)
                self._plans[(db, shape)] = plan
        return plan, flat

    def _compile(self, db: str, values: Sequence[object], flat: list[object]) -> _Plan:
        sentinels = [_sentinel(v, i) for i, v in enumerate(flat)]
        queryset = self._build(*_rebuild(values, sentinels))
        compiler = queryset.query.get_compiler(using=db)
        # (A select_for_update read compiles only in a transaction, as the ORM requires;
        # every later run checks it again, see _rows.)
        sql, params = compiler.as_sql()
        # Compiled a second time with other placeholders: a parameter that is not a
        # placeholder and differs between the two (a clock reading, a made-up id, a text
        # derived from an argument) is not a constant.
        others = [_sentinel(v, i + len(flat)) for i, v in enumerate(flat)]
        other_sql, other_params = (
            self._build(*_rebuild(values, others)).query.get_compiler(using=db).as_sql()
        )
        if other_sql != sql or len(other_params) != len(params):
            raise NotCompilable("the statement's text depends on its arguments' values")
        slots: list[_Slot | None] = []
        constants: list[object] = []
        for param, other in zip(params, other_params, strict=True):
            slot = None
            for index, sentinel in enumerate(sentinels):
                if (bind := _bind_of(param, sentinel, db)) is not None:
                    if _bind_of(other, others[index], db) != bind:
                        raise NotCompilable("an argument is not bound as itself")
                    slot = _Slot(index, bind)
                    break
            if slot is None and (
                other != param
                or not isinstance(param, _CONSTANT_TYPES)
                or _mentions(param, sentinels)
                or _looks_made_up(param)
            ):
                raise NotCompilable(
                    f"the statement binds {param!r}, which is not one of the read's "
                    "arguments: pass every value the read depends on (a `now` too)"
                )
            slots.append(slot)
            constants.append(None if slot else param)
        if {s.arg for s in slots if s is not None} != set(range(len(sentinels))):
            raise NotCompilable("an argument is not bound as itself in the statement")
        columns = [s[0] for s in compiler.select[0 : compiler.col_count]]
        return _Plan(
            sql,
            slots,
            constants,
            compiler,
            bool(queryset.query.select_for_update)
            and connections[db].features.has_select_for_update,
            db,
            queryset._fetch_mode,  # type: ignore[attr-defined]
            None
            if compiler.has_composite_fields(columns)
            else list(compiler.get_converters(columns).items()),
        )

    def _rows(
        self, values: Sequence[object], db: str
    ) -> tuple[_Plan | None, list[tuple[Any, ...]]]:
        if any(isinstance(v, list | tuple) and not v for v in values):
            return None, []  # `__in` an empty list matches nothing: the ORM sends no query
        plan, flat = self._plan(db, values)
        connection = connections[db]
        if plan.for_update and connection.get_autocommit():
            raise TransactionManagementError(
                "select_for_update cannot be used outside of a transaction."
            )
        with fixed_cursor(db) as cursor:
            cursor.execute(plan.sql, plan.params(flat))
            rows = cursor.fetchall()
        compiler = plan.compiler
        if compiler.has_extra_select:
            rows = [row[: compiler.col_count] for row in rows]
        return plan, plan.convert(rows)

    def all(self, *values: object, using: str = DEFAULT_DB_ALIAS) -> list[M]:
        """The model instances of the read, as iterating its QuerySet would give them."""
        plan, rows = self._rows(values, using)
        if plan is None:
            return []
        compiler = plan.compiler
        select, klass_info = compiler.select, compiler.klass_info
        annotations = compiler.annotation_col_map or {}
        model: type[M] = klass_info["model"]
        start, end = klass_info["select_fields"][0], klass_info["select_fields"][-1] + 1
        names = [f[0].target.attname for f in select[start:end]]
        fetch_mode = plan.fetch_mode
        populators = get_related_populators(klass_info, select, using, fetch_mode)
        out: list[M] = []
        for row in rows:
            obj = model.from_db(using, names, row[start:end], fetch_mode=fetch_mode)
            for populator in populators:
                populator.populate(row, obj)
            for name, position in annotations.items():
                setattr(obj, name, row[position])
            out.append(obj)
        if fetch_mode.track_peers:  # (FETCH_PEERS: each instance knows the others)
            peers: list[Any] = [weak_ref(obj) for obj in out]
            for obj in out:
                obj._state.peers = peers
        return out

    def first(self, *values: object, using: str = DEFAULT_DB_ALIAS) -> M | None:
        """The first instance of the read (build it ordered and sliced), or None."""
        found = self.all(*values, using=using)
        return found[0] if found else None

    def tuples(self, *values: object, using: str = DEFAULT_DB_ALIAS) -> list[tuple[Any, ...]]:
        """The rows of a values_list() read, converted as the ORM converts them."""
        return self._rows(values, using)[1]


# --- Writes -------------------------------------------------------------------------------

_INSERTS: dict[tuple[str, type[Model], int, str], str] = {}


def insert(objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS) -> None:
    """INSERT `objs` (new rows of one model, primary keys set: UUIDs made in Python) in one
    statement, as `bulk_create` would write them (each field's pre_save, e.g. auto_now_add,
    and its database value), with the statement's text built once per model and row count.

    Raises what the statement raises, as Django's errors (an IntegrityError for a unique
    constraint). For models with a database-made key, use bulk_create.
    """
    if not objs:
        return
    statement = insert_statement(objs, using)
    if statement is None:
        type(objs[0])._default_manager.db_manager(using).bulk_create(objs)  # the general case
        return
    # (one text and set of parameter types per row count and NULLs: prepared at once for
    # one row, at psycopg's count for more)
    with fixed_cursor(using, prepare=True if len(objs) == 1 else None) as cursor:
        cursor.execute(*statement)
    inserted(objs, using)


def insert_statement(
    objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS
) -> tuple[str, list[Any]] | None:
    """The INSERT `insert` sends for `objs`, with its parameters, for a caller that sends
    it itself (then calls `inserted`); None when bulk_create must write them (a database
    default, an expression, more rows than one statement takes, a missing key)."""
    model = type(objs[0])
    meta = model._meta
    assert all(type(obj) is model for obj in objs), "one model per insert"
    assert not meta.auto_field, "a database-made key: use bulk_create"
    connection = connections[using]
    fields, layout = _insert_layout(model)
    for obj in objs:  # (loops, not generators: this runs for every admitted call)
        if obj.pk is None:
            return None
        for f in fields:
            # (a value left to a database default is an expression, DatabaseDefault: a
            # field with both a Python and a database default carries the Python one here)
            if hasattr(getattr(obj, f.attname), "resolve_expression"):
                return None
    if connection.ops.bulk_batch_size(fields, objs) < len(objs):
        return None
    for obj in objs:
        obj._prepare_related_fields_for_save(operation_name="insert")  # type: ignore[attr-defined]
    sql = _insert_sql(using, model, fields, len(objs))
    params: list[Any] = []
    for obj in objs:
        for f, bind, plain in layout:
            # (Field.pre_save is the attribute itself; a field's own, e.g. auto_now, runs)
            value = getattr(obj, f.attname) if plain else f.pre_save(obj, True)
            params.append(bind(value, connection))
    return sql, params


@functools.cache
def _insert_layout(
    model: type[Model],
) -> tuple[list[Field[Any, Any]], list[tuple[Field[Any, Any], Binder, bool]]]:
    """The columns `insert_statement` writes, and for each its binder and whether its
    pre_save is Field's own (the attribute as it is), found once per model."""
    fields = [f for f in model._meta.concrete_fields if not f.generated]
    return fields, [(f, binder(f), type(f).pre_save is Field.pre_save) for f in fields]


def _insert_sql(
    using: str,
    model: type[Model],
    fields: Sequence[Field[Any, Any]],
    rows: int,
    returning: Field[Any, Any] | None = None,
) -> str:
    """`INSERT INTO <table> (<fields>) VALUES (%s, ...), ...` for `rows` rows (then
    `RETURNING <returning>`), built once per model, row count and returned column (only
    the model's quoted names are in the text; every value is a parameter)."""
    vendor = connections[using].vendor
    key = (vendor, model, rows, str(returning.column) if returning else "")
    sql = _INSERTS.get(key)
    if sql is None:
        quote = connections[using].ops.quote_name
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        sql = (
            f"INSERT INTO {quote(model._meta.db_table)} "  # noqa: S608 (the model's names only)
            f"({', '.join(quote(str(f.column)) for f in fields)}) VALUES "
            + ", ".join([row] * rows)
            + (f" RETURNING {quote(str(returning.column))}" if returning else "")
        )
        _INSERTS[key] = sql
    return sql


def _save_does_more(obj: Model, fields: Sequence[Field[Any, Any]]) -> bool:
    """Whether `save` would do more than write these fields' values: a model with its own
    save(), save signal receivers, or an expression among the values."""
    model = type(obj)
    return (
        model.save is not Model.save
        or signals.pre_save.has_listeners(model)
        or signals.post_save.has_listeners(model)
        or any(hasattr(getattr(obj, f.attname), "resolve_expression") for f in fields)
    )


# --- Values as the ORM binds them ------------------------------------------------------

Binder = Callable[[Any, Any], Any]

_TEXT_FIELDS = (models.CharField, models.TextField)
_INTEGER_FIELDS = (
    models.IntegerField,
    models.BigIntegerField,
    models.SmallIntegerField,
    models.PositiveIntegerField,
    models.PositiveBigIntegerField,
    models.PositiveSmallIntegerField,
)
_BINDERS: dict[Field[Any, Any], Binder] = {}


def binder(field: Field[Any, Any]) -> Binder:
    """`field.get_db_prep_save` as a function of (value, connection) that gives the same
    parameter, in fewer calls for the values the hot paths' writes hold: text, integers,
    aware datetimes, UUIDs, booleans and None in Django's own field classes, where the
    ORM's chain (get_db_prep_save, get_db_prep_value, get_prep_value, to_python) returns
    the value itself or one backend adapter's result for it. Anything else (another
    value type, a subclass of a field class, a JSON or key field's value) goes through
    the ORM's method. tests/floor/test_binders.py holds each to the ORM's result."""
    bind = _BINDERS.get(field)
    if bind is None:
        bind = _BINDERS[field] = _make_binder(field)
    return bind


def _make_binder(field: Field[Any, Any]) -> Binder:  # noqa: C901 (one case per class)
    general: Binder = field.get_db_prep_save
    kind = type(field)
    if kind in _TEXT_FIELDS:

        def bind_text(value: Any, connection: Any) -> Any:
            # (to_python keeps any str, a str enum included; a lazy text is no str)
            return value if isinstance(value, str) or value is None else general(value, connection)

        return bind_text
    if kind in _INTEGER_FIELDS:
        internal = field.get_internal_type()

        def bind_integer(value: Any, connection: Any) -> Any:
            if type(value) is int or value is None:
                return connection.ops.adapt_integerfield_value(value, internal)
            return general(value, connection)

        return bind_integer
    if kind is models.DateTimeField:

        def bind_datetime(value: Any, connection: Any) -> Any:
            # (a naive datetime is made aware with a warning by the ORM: its own path)
            if value is None or (type(value) is dt.datetime and value.utcoffset() is not None):
                return connection.ops.adapt_datetimefield_value(value)
            return general(value, connection)

        return bind_datetime
    if kind is models.UUIDField:

        def bind_uuid(value: Any, connection: Any) -> Any:
            if value is None:
                return None
            if type(value) is uuid.UUID:
                return value if connection.features.has_native_uuid_field else value.hex
            return general(value, connection)

        return bind_uuid
    if kind is models.BooleanField:

        def bind_bool(value: Any, connection: Any) -> Any:
            return value if type(value) is bool or value is None else general(value, connection)

        return bind_bool
    if kind is models.ForeignKey:
        target = binder(field.target_field)  # type: ignore[attr-defined]

        def bind_key(value: Any, connection: Any) -> Any:
            if value is None:
                return None
            if type(value) is uuid.UUID or type(value) is int:  # (neither equals "")
                return target(value, connection)
            return general(value, connection)

        return bind_key
    return general


def create(obj: Model, using: str = DEFAULT_DB_ALIAS) -> None:
    """INSERT one new row of a plain model whose key the database makes (an AutoField),
    with the values `Model.objects.create` would write (each field's pre_save, e.g.
    auto_now_add, and its database value), and set its key from the statement's RETURNING:
    one prepared statement, its text built once per model (an ask's approval row).

    Falls back to `save` for anything it does not do itself: a model with its own save()
    or save machinery, save signal receivers, a parent table, `order_with_respect_to`, a
    column the database returns besides the key (a generated or database-default one), an
    expression value, a database without RETURNING. The database alias is `using`, as
    everywhere in this module (no router). Any error marks the transaction for rollback,
    as save's do.
    """
    model = type(obj)
    meta = model._meta
    connection = connections[using]
    auto = meta.auto_field
    fields = [f for f in meta.concrete_fields if f is not auto]
    if (
        auto is None  # (also a child model: its key is the parent's link)
        or obj.pk is not None
        or meta.parents
        or meta.order_with_respect_to
        or not connection.features.can_return_columns_from_insert
        or any(f.generated or f.db_returning or f.db_default is not NOT_PROVIDED for f in fields)
        or model.save_base is not Model.save_base
        or model._do_insert is not Model._do_insert  # type: ignore[attr-defined]
        or _save_does_more(obj, fields)
    ):
        obj.save(force_insert=True, using=using)
        return
    sql = _insert_sql(using, model, fields, 1, returning=auto)
    with transaction.mark_for_rollback_on_error(using):
        obj._prepare_related_fields_for_save(operation_name="save")  # type: ignore[attr-defined]
        params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
        with fixed_cursor(using) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    obj.pk = auto.to_python(row[0])
    obj._state.adding = False
    obj._state.db = using


def inserted(objs: Sequence[Model], using: str = DEFAULT_DB_ALIAS) -> None:
    """Mark `objs` as saved rows (after their `insert_statement` ran), as bulk_create does."""
    for obj in objs:
        obj._state.adding = False
        obj._state.db = using


_UPDATES: dict[tuple[str, type[Model], tuple[str, ...], tuple[str, ...]], str] = {}


def update_sql(
    model: type[Model], columns: Sequence[str], where: Sequence[str], using: str = DEFAULT_DB_ALIAS
) -> str:
    """`UPDATE <table> SET <column> = %s, ... WHERE <column> = %s AND ...`, built once per
    model and columns (only the model's quoted names are in the text; every value is a
    parameter: the SET values first, then the WHERE ones, in the order given)."""
    vendor = connections[using].vendor
    key = (vendor, model, tuple(columns), tuple(where))
    sql = _UPDATES.get(key)
    if sql is None:
        quote = connections[using].ops.quote_name
        sets = ", ".join(f"{quote(c)} = %s" for c in columns)
        conditions = " AND ".join(f"{quote(c)} = %s" for c in where)
        sql = _UPDATES[key] = f"UPDATE {quote(model._meta.db_table)} SET {sets} WHERE {conditions}"  # noqa: S608
    return sql


def save_fields(obj: Model, names: Sequence[str], using: str = DEFAULT_DB_ALIAS) -> None:
    """What `obj.save(update_fields=names)` writes for a saved row (an UPDATE by primary
    key of those columns, each field's pre_save applied), with the statement's text built
    once per model and set of fields. Falls back to `save` whenever save would do more:
    a model with its own save() or with save signal receivers, an expression value, a
    relation or a name that is not a concrete column.

    Raises the model's NotUpdated (a DatabaseError) when no row was updated, as save does.
    """
    model = type(obj)
    meta = model._meta
    fields: list[Field[Any, Any]] = []
    for name in names:
        field = meta.get_field(name)
        if (
            not isinstance(field, Field)
            or not field.concrete
            or field.primary_key
            or field.generated
            or field.model is not model  # (a parent table's column: save updates that table)
        ):
            fields = []
            break
        fields.append(field)
    if not fields or obj._state.adding or _save_does_more(obj, fields):
        obj.save(using=using, update_fields=list(names))
        return
    obj._prepare_related_fields_for_save(operation_name="save")  # type: ignore[attr-defined]
    connection = connections[using]
    sql = update_sql(model, [str(f.column) for f in fields], [str(meta.pk.column)], using)
    params = [f.get_db_prep_save(f.pre_save(obj, False), connection) for f in fields]
    params.append(meta.pk.get_db_prep_save(obj.pk, connection))
    # As save: an error inside a transaction marks it for rollback.
    with transaction.mark_for_rollback_on_error(using), fixed_cursor(using) as cursor:
        cursor.execute(sql, params)
        if cursor.rowcount != 1:  # what save raises (a DatabaseError too)
            raise model.NotUpdated("Save with update_fields did not affect any rows.")  # type: ignore[attr-defined]
    obj._state.db = using
