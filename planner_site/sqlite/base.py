from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Any

from django.db.backends.sqlite3 import base

# One writer at a time per process, queued here rather than in SQLite. SQLite makes a waiting writer poll
# for the lock with growing sleeps (1, 2, 5 ... 100 ms): with a runner's many threads the lock sat free
# while they slept, and a round of a hundred agents spent many seconds, summed, waiting on it. A thread
# here wakes as soon as the writer before it is done. Other processes (the web, another runner) still
# queue in SQLite. Waiting here is bounded by the connection's timeout; past it, SQLite decides as before.
WRITERS = threading.Lock()
WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


@functools.lru_cache(maxsize=2048)
def qmark(query: str) -> str:
    """Django's "format" to SQLite's "qmark" placeholders, once per distinct SQL text (a regex each time
    cost a runner's cycles more than some of their statements took in SQLite)."""
    return base.FORMAT_QMARK_REGEX.sub("?", query).replace("%%", "%")


class QueuedCursor(base.SQLiteCursorWrapper):
    """A write outside a transaction (one statement, committed at once) takes its turn too."""

    db: DatabaseWrapper

    def convert_query(self, query: str, *, param_names: Any = None) -> str:
        if param_names is None:
            return qmark(query)
        return super().convert_query(query, param_names=param_names)  # type: ignore[no-any-return]

    def execute(self, query: str, params: Any = None) -> Any:
        if not self.db.queues(query):
            return super().execute(query, params)
        with self.db.writer_turn():
            return super().execute(query, params)

    def executemany(self, query: str, param_list: Any) -> Any:
        if not self.db.queues(query):
            return super().executemany(query, param_list)
        with self.db.writer_turn():
            return super().executemany(query, param_list)


class WriterTurn:
    def __init__(self, db: DatabaseWrapper) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.writer_acquire()

    def __exit__(self, *exc: object) -> None:
        self.db.writer_release()


class DatabaseWrapper(base.DatabaseWrapper):
    holds_writer = False  # this connection's transaction or statement holds WRITERS

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        name = str(conn_params.get("database", ""))
        if name and name != ":memory:" and not name.startswith("file:"):
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        return super().get_new_connection(conn_params)

    def create_cursor(self, name: str | None = None) -> Any:
        cursor = self.connection.cursor(factory=QueuedCursor)
        cursor.db = self
        return cursor

    def queues(self, query: str) -> bool:
        """Whether a statement waits for its turn: a write, outside a transaction (which waited already)."""
        return not self.in_atomic_block and not self.holds_writer and query.lstrip()[:7].upper().startswith(WRITES)

    def writer_turn(self) -> WriterTurn:
        return WriterTurn(self)

    def writer_acquire(self) -> None:
        self.holds_writer = WRITERS.acquire(timeout=float(self.settings_dict["OPTIONS"].get("timeout", 5)))

    def writer_release(self) -> None:
        if self.holds_writer:
            self.holds_writer = False
            WRITERS.release()

    def _start_transaction_under_autocommit(self) -> None:
        self.writer_acquire()
        try:
            super()._start_transaction_under_autocommit()  # type: ignore[misc]  # a hook the stubs lack
        except BaseException:
            self.writer_release()
            raise

    def _commit(self) -> None:
        try:
            super()._commit()  # type: ignore[misc]  # a backend hook the stubs leave out
        finally:
            self.writer_release()

    def _rollback(self) -> None:
        try:
            super()._rollback()  # type: ignore[misc]  # a backend hook the stubs leave out
        finally:
            self.writer_release()

    def _close(self) -> None:
        try:
            super()._close()  # type: ignore[misc]  # a backend hook the stubs leave out
        finally:
            self.writer_release()
