"""Hand-written reads for the few queries every agent cycle runs, where building the SQL through the ORM
costs more than running it (about a millisecond of Python per query, against tens of microseconds in the
database).

The SQL is written once per model and database vendor from the models' meta (table, columns, quoting), so
a model change cannot drift from it; rows become model instances through `Model.from_db` after the fields'
own database converters, so callers get the same objects a QuerySet would give them. Only plain column
reads live here; anything with a filter or an order of its own is spelled out by the caller in SQL that
names its tables through `table()` and `column()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from django.db import connection
from django.db.models import Field, Model

Converter = Callable[[Any, Any, Any], Any]


def table(model: type[Model]) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def column(model: type[Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column
    return connection.ops.quote_name(field.column)


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
