"""The database connection of a worker thread: given back while the thread waits, recovered after a failure.

On PostgreSQL the connections come from a pool (settings: DB_POOL_MAX_SIZE per process), so "closing" one
hands it back for the next cycle instead of ending it: a thread that waits for a model holds no connection,
and a runner can drive far more agents at once than PostgreSQL's `max_connections` would allow with one
connection each. SQLite keeps each thread's connection (opening one is cheap and no server counts them).
"""

from __future__ import annotations

from typing import Any

from django.db import InterfaceError, OperationalError, connection, connections

# What a lost connection or a database outage raises (a terminated backend, a refused connect, a
# restart): the runner waits and retries these; any other error is a bug in one cycle.
CONNECTION_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def connection_release() -> None:
    """Give this thread's connection back to the pool, unless a transaction still needs it."""
    if connection.vendor == "sqlite" or connection.in_atomic_block:
        return
    connection.close()


def connection_recover() -> None:
    """After an error: drop this thread's connection if it is broken, so the next query opens a fresh one."""
    if connection.in_atomic_block or connection.connection is None:
        return
    if not connection.is_usable():
        connection.close()
    else:
        connection.errors_occurred = False


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
