"""Queries compiled once: the ORM writes their SQL the first time; later runs send that SQL as it is.

For the small hot reads of the live pushes and of every dashboard view, compiling the queryset (its
joins, subqueries and SELECT list) costs more than the database takes to answer it: the dashboard's
counts took 2.2 ms to compile and 1.5 ms to run. A `Statement` is for a queryset whose SQL never changes
(or only its parameters' values, given to `rows`); its rows come back converted as the ORM converts them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from django.db import connection, connections
from django.db.models import Expression, Field, Model, QuerySet, Value

from planner_site.kept import Kept


class Statement:
    """One queryset's SQL, its parameters and its columns' converters, taken from the ORM's compiler."""

    def __init__(self, queryset: QuerySet[Any]) -> None:
        self.using = queryset.db
        self.compiler = queryset.query.get_compiler(using=self.using)
        self.sql, self.params = self.compiler.as_sql()
        columns = [select[0] for select in self.compiler.select[: self.compiler.col_count]]
        self.converters = self.compiler.get_converters(columns)

    def fetched(self, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """The rows as the database gives them, with the parameters it was compiled with, or these instead (the
        same number, in order)."""
        if params is not None and len(params) != len(self.params):
            raise ValueError(f"this statement takes {len(self.params)} parameters, not {len(params)}")
        with connections[self.using].cursor() as cursor:
            cursor.execute(self.sql, self.params if params is None else tuple(params))
            return cursor.fetchall()

    def rows(self, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """The rows, converted, with the parameters it was compiled with or these instead (see `fetched`)."""
        rows = self.fetched(params)
        if self.converters:
            return [tuple(row) for row in self.compiler.apply_converters(rows, self.converters)]
        return [tuple(row) for row in rows]


STATEMENTS_KEPT = 256
_kept: Kept[Statement] = Kept(STATEMENTS_KEPT)


def statement_kept(name: str, build: Callable[[], QuerySet[Any] | Statement], *,
                   params: Sequence[Any] | None = None) -> Statement:
    """The statement kept under this name for the default database, compiled on first use (bounded: the
    least recently used goes first).

    `build` (a queryset, or a statement such as `Stacked`) runs once per process and database vendor: its SQL
    must never change. With `params`, only those may: the compiled statement must take exactly these values,
    in this order (checked), so that `rows()` can be given others.
    """
    def compile_checked() -> Statement:
        built = build()
        statement = built if isinstance(built, Statement) else Statement(built)
        if params is not None and list(statement.params) != list(params):
            raise ValueError(f"statement {name} takes {statement.params}, not {list(params)}")
        return statement

    return _kept.get((name, connections["default"].vendor), compile_checked)


def columns(model: type[Model], *names: str) -> tuple[str, ...]:
    """These columns in the model's order, as `Model.from_db` takes the values of some of its fields."""
    return tuple(f.attname for f in model._meta.concrete_fields if f.attname in names)


def all_columns(model: type[Model], through: str = "") -> list[str]:
    """Every column of the model, in its order, for `values_list` (`through="plan__"` reads them over a
    relation), so that `instance()` can rebuild the model from a row."""
    return [through + f.attname for f in model._meta.concrete_fields]


class Null(Expression):
    """A NULL of a field's type. Typed on PostgreSQL, which resolves the column types of a UNION pair by pair (a
    column NULL in two parts would be text there); SQLite needs no type."""

    def __init__(self, output_field: Field) -> None:
        super().__init__(output_field=output_field)

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        return "NULL", ()

    def as_postgresql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        return f"NULL::{self.output_field.cast_db_type(connection)}", ()


class Stacked(Statement):
    """Several querysets' rows in one statement (UNION ALL), so that a read of different things costs one round
    trip. Every row has the columns of `layout`, one field each; a part names, column by column, the field or
    annotation it reads there, or None: a NULL of that column's type (so each column has one type in every
    part, and the first part's converters serve every part's rows). A row is converted only in the columns
    its part reads. The parts are unordered: the caller sorts.
    """

    def __init__(self, layout: Sequence[Field], parts: Sequence[tuple[QuerySet[Any], Sequence[str | None]]]) -> None:
        selected = []
        for number, (queryset, names) in enumerate(parts):
            if len(names) != len(layout):
                raise ValueError(f"part {number} names {len(names)} columns; the layout has {len(layout)}")
            nulls = {f"null_{i}": Null(layout[i]) for i, name in enumerate(names) if name is None}
            selected.append(queryset.order_by().annotate(part=Value(number), **nulls).values_list(
                "part", *(f"null_{i}" if name is None else name for i, name in enumerate(names))))
        first, *rest = selected
        super().__init__(first.union(*rest, all=True).order_by())
        # Column 0 is the part's number; column i + 1 is the layout's column i.
        self.part_converters = [{pos: c for pos, c in self.converters.items() if pos and names[pos - 1] is not None}
                                for _, names in parts]

    def part_rows(self, params: Sequence[Any] | None = None) -> list[tuple[int, tuple[Any, ...]]]:
        """Each row as its part's number and its columns (laid out as the layout), converted."""
        by_part: list[list[Any]] = [[] for _ in self.part_converters]
        for row in self.fetched(params):
            by_part[row[0]].append(row)
        return [(number, tuple(row[1:])) for number, converters in enumerate(self.part_converters)
                for row in (self.compiler.apply_converters(by_part[number], converters) if converters
                            else by_part[number])]


def fields(model: type[Model]) -> list[Field]:
    """The model's columns as `all_columns(model)` lays them out, for a `Stacked` layout."""
    return list(model._meta.concrete_fields)


def instance[M: Model](model: type[M], row: Sequence[Any], start: int = 0) -> M | None:
    """The model in `row[start:]`, laid out by `all_columns(model)` and already converted (a Statement's
    rows are); None when its primary key is NULL (an outer join that found nothing)."""
    names = [f.attname for f in model._meta.concrete_fields]
    values = row[start:start + len(names)]
    if values[0] is None:
        return None
    return model.from_db("default", names, values)


# Writes of the hot paths (an agent's cycle): an INSERT or a plain-equality UPDATE whose SQL is written once
# per model from its meta; values are prepared by their fields as save() and update() prepare them.


def _insert_columns(model: type[Model]) -> tuple[list[Field], str]:
    """The fields an INSERT gives values for (all but the primary key) and their quoted columns."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    return fields, ", ".join(connection.ops.quote_name(f.column or "") for f in fields)


@cache
def _insert_sql(model: type[Model], vendor: str, rows: int) -> tuple[str, list[Field]]:
    fields, names = _insert_columns(model)
    pk = connection.ops.quote_name(_field(model, model._meta.pk.name).column or "")  # type: ignore[union-attr]
    values = ", ".join([f"({', '.join(['%s'] * len(fields))})"] * rows)
    return f"INSERT INTO {table(model)} ({names}) VALUES {values} RETURNING {pk}", fields  # noqa: S608


def insert(objs: Sequence[Model]) -> None:
    """Save new instances of one model in one statement, as `bulk_create` would (auto_now values and
    defaults filled by the fields' pre_save, values prepared by the fields), and set their primary keys
    (returned in the order of the rows, which both databases keep, as bulk_create relies on)."""
    if not objs:
        return
    sql, fields = _insert_sql(type(objs[0]), connection.vendor, len(objs))
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for obj in objs for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        for obj, (pk,) in zip(objs, cursor.fetchall(), strict=True):
            obj.pk = pk
            obj._state.adding = False
            obj._state.db = connection.alias


@cache
def _insert_new_sql(model: type[Model], vendor: str, match: tuple[str, ...]) -> tuple[str, list[Field]]:
    fields, names = _insert_columns(model)
    conditions = " AND ".join(f"{column(model, name)} = %s" for name in match)
    return (f"INSERT INTO {table(model)} ({names}) SELECT {', '.join(['%s'] * len(fields))} "  # noqa: S608
            f"WHERE NOT EXISTS (SELECT 1 FROM {table(model)} WHERE {conditions})"), fields


def insert_new(obj: Model, *match: str) -> bool:
    """Save a new instance, as `insert` does, unless a row already has its values in the `match` fields (one
    statement: INSERT ... SELECT ... WHERE NOT EXISTS); whether it was saved (its primary key is not set).
    For rows one writer at a time adds (two at once could both find none)."""
    sql, fields = _insert_new_sql(type(obj), connection.vendor, match)
    params = [f.get_db_prep_save(f.pre_save(obj, True), connection) for f in fields]
    params += [_field(type(obj), name).get_db_prep_value(getattr(obj, _field(type(obj), name).attname), connection)
               for name in match]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount == 1


@cache
def _update_sql(model: type[Model], vendor: str, sets: tuple[str, ...], where: tuple[str, ...]) -> str:
    assignments = ", ".join(f"{column(model, name)} = %s" for name in sets)
    conditions = " AND ".join(f"{column(model, name)} = %s" for name in where)
    return f"UPDATE {table(model)} SET {assignments} WHERE {conditions}"  # noqa: S608


def update(model: type[Model], values: Mapping[str, Any], **where: Any) -> int:
    """`Model.objects.filter(**where).update(**values)` for plain equality filters; the number of rows."""
    sets, keys = tuple(values), tuple(where)
    params = [_field(model, name).get_db_prep_save(values[name], connection) for name in sets]
    params += [_field(model, name).get_db_prep_value(where[name], connection) for name in keys]
    with connection.cursor() as cursor:
        cursor.execute(_update_sql(model, connection.vendor, sets, keys), params)
        return cursor.rowcount


def _field(model: type[Model], name: str) -> Field:
    field = model._meta.get_field(name)
    assert isinstance(field, Field)
    return field



def table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[Model], name: str) -> str:
    return connection.ops.quote_name(_field(model, name).column or "")
