"""Hand-written reads for the few queries every agent cycle runs, where building the SQL through the ORM
costs more than running it (about a millisecond of Python per query, against tens of microseconds in the
database).

The SQL is written once per model and database vendor from the models' meta (table, columns, quoting), so
a model change cannot drift from it; rows become model instances through `Model.from_db` after the fields'
own database converters, so callers get the same objects a QuerySet would give them. Reads with a filter or an
order of their own are spelled out by the caller in SQL that names tables and columns through `table()` and
`column()`; inserts and plain-equality updates prepare each value through its field, as `save()` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field, Model

Converter = Callable[[Any, Any, Any], Any]


def table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[Model], name: str) -> str:
    return connection.ops.quote_name(_field(model, name).column or "")


@cache
def _layout(model: type[Model], vendor: str) -> tuple[list[str], list[str], list[tuple[list[Converter], Any]]]:
    """Column names, attribute names and each column's converters (with the column expression they are
    called with, as the compiler does), in the model's concrete field order."""
    fields = model._meta.concrete_fields
    columns = [connection.ops.quote_name(f.column or "") for f in fields]
    converters = []
    for f in fields:
        col = f.get_col(model._meta.db_table)
        converters.append(([*connection.ops.get_db_converters(col), *f.get_db_converters(connection)], col))
    return columns, [f.attname for f in fields], converters


def select_list(model: type[Model], alias: str) -> str:
    """`alias."col1", alias."col2", ...` for every concrete field, in the order `build` reads them."""
    columns, _, _ = _layout(model, connection.vendor)
    return ", ".join(f"{alias}.{c}" for c in columns)


def width(model: type[Model]) -> int:
    return len(model._meta.concrete_fields)


def build[M: Model](model: type[M], row: Sequence[Any], start: int = 0) -> M | None:
    """The instance in `row[start:start + width(model)]`; None when its primary key is NULL (an outer join
    that found nothing)."""
    _, attnames, converters = _layout(model, connection.vendor)
    values = list(row[start:start + len(attnames)])
    if values[0] is None and model._meta.concrete_fields[0].primary_key:
        return None
    for i, (chain, col) in enumerate(converters):
        for convert in chain:
            values[i] = convert(values[i], col, connection)
    return model.from_db(connection.alias, attnames, values)


def fetch(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


@cache
def _insert_sql(model: type[Model], vendor: str, rows: int) -> tuple[str, list[Field]]:
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(connection.ops.quote_name(f.column or "") for f in fields)
    pk = connection.ops.quote_name(_field(model, model._meta.pk.name).column or "")  # type: ignore[union-attr]
    values = ", ".join([f"({', '.join(['%s'] * len(fields))})"] * rows)
    return f"INSERT INTO {table(model)} ({columns}) VALUES {values} RETURNING {pk}", fields  # noqa: S608


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
