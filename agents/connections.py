"""The database connection of a worker thread: given back while the thread waits, recovered after a failure.

On PostgreSQL the connections come from a pool (settings: DB_POOL_MAX_SIZE per process), so "closing" one
hands it back for the next cycle instead of ending it: a thread that waits for a model holds no connection,
and a runner can drive far more agents at once than PostgreSQL's `max_connections` would allow with one
connection each. SQLite keeps each thread's connection (opening one is cheap and no server counts them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import InterfaceError, OperationalError, close_old_connections, connection, transaction
from django.db.transaction import TransactionManagementError

# What a lost connection or a database outage raises (a terminated backend, a refused connect, a
# restart): the runner waits and retries these; any other error is a bug in one cycle.
CONNECTION_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


def in_transaction() -> bool:
    """Whether this thread is inside `atomic()` (a caller's transaction, a test's), found without opening a
    connection: `transaction.get_autocommit()` connects first, which here would take a pooled connection only to
    give it back, or wait out the pool's timeout during an outage. The rollback flag exists only inside atomic()."""
    try:
        transaction.get_rollback()
    except TransactionManagementError:
        return False
    return True


def connection_release() -> None:
    """Give this thread's connection back to the pool, unless a transaction still needs it."""
    if connection.vendor == "sqlite" or in_transaction():
        return
    connection.close()


def connection_recover() -> None:
    """After an error: drop this thread's connection if it is broken, so the next query opens a fresh one."""
    if in_transaction():
        return
    close_old_connections()  # Django's own check after an error (as at a request's end)


@contextlib.contextmanager
def connection_scope() -> Iterator[None]:
    """Database work of a thread outside a request: a connection the database cut under it is dropped (the next
    statement opens a fresh one), and the connection is given back once it ends."""
    try:
        yield
    except CONNECTION_ERRORS:
        connection_recover()
        raise
    finally:
        connection_release()


def error_brief(exc: BaseException) -> str:
    """One line for the log: the driver's first line, without the SQL or the traceback."""
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]
