"""The check PostgreSQL's connection pool runs on a connection before handing it out (settings: DATABASES
OPTIONS pool "check"). Imports no app code, so settings can name it."""

from __future__ import annotations

from typing import Any

from django.db import connections


def pool_connection_check(conn: Any) -> None:
    """The pool's check of a connection before it hands it out (settings: DATABASES OPTIONS pool "check").

    One dead connection means the server restarted, failed over or cut its clients: the others in the pool
    are as dead. The pool would find each by a failed check followed by a growing wait (1, 2, 4 s...) and
    give up after its timeout, so the whole pool is replaced at once instead.
    """
    from psycopg_pool import ConnectionPool

    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        pool = connections["default"].pool  # type: ignore[attr-defined]  # the PostgreSQL backend's own pool
        if pool is not None:
            pool.drain()
        raise
