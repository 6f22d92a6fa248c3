"""Queries compiled once: the ORM writes their SQL the first time; later runs send that SQL as it is.

For the small hot reads of the live pushes and of every dashboard view, compiling the queryset (its
joins, subqueries and SELECT list) costs more than the database takes to answer it: the dashboard's
counts took 2.2 ms to compile and 1.5 ms to run. A `Statement` is for a queryset whose SQL never changes
(or only its parameters' values, given to `rows`); its rows come back converted as the ORM converts them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from threading import Lock
from typing import Any

from django.db import connections
from django.db.models import Model, QuerySet


class Statement:
    """One queryset's SQL, its parameters and its columns' converters, taken from the ORM's compiler."""

    def __init__(self, queryset: QuerySet[Any]) -> None:
        self.using = queryset.db
        self.compiler = queryset.query.get_compiler(using=self.using)
        self.sql, self.params = self.compiler.as_sql()
        columns = [select[0] for select in self.compiler.select[: self.compiler.col_count]]
        self.converters = self.compiler.get_converters(columns)

    def rows(self, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """The rows, with the parameters it was compiled with, or these instead (the same number, in order)."""
        if params is not None and len(params) != len(self.params):
            raise ValueError(f"this statement takes {len(self.params)} parameters, not {len(params)}")
        with connections[self.using].cursor() as cursor:
            cursor.execute(self.sql, self.params if params is None else tuple(params))
            rows = cursor.fetchall()
        if self.converters:
            return [tuple(row) for row in self.compiler.apply_converters(rows, self.converters)]
        return [tuple(row) for row in rows]


STATEMENTS_KEPT = 256
_kept: OrderedDict[tuple[str, str], Statement] = OrderedDict()
_lock = Lock()


def statement_kept(name: str, build: Callable[[], QuerySet[Any]], *,
                   params: Sequence[Any] | None = None) -> Statement:
    """The statement kept under this name for the default database, compiled on first use (bounded: the
    least recently used goes first).

    `build` runs once per process and database vendor: its SQL must never change. With `params`, only
    those may: the compiled statement must take exactly these values, in this order (checked), so that
    `rows()` can be given others.
    """
    key = (name, connections["default"].vendor)
    with _lock:
        statement = _kept.get(key)
        if statement is not None:
            _kept.move_to_end(key)
    if statement is None:
        statement = Statement(build())
        if params is not None and list(statement.params) != list(params):
            raise ValueError(f"statement {name} takes {statement.params}, not {list(params)}")
        with _lock:
            _kept[key] = statement
            while len(_kept) > STATEMENTS_KEPT:
                _kept.popitem(last=False)
    return statement


def columns(model: type[Model], *names: str) -> tuple[str, ...]:
    """These columns in the model's order, as `Model.from_db` takes the values of some of its fields."""
    return tuple(f.attname for f in model._meta.concrete_fields if f.attname in names)
