from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from django.db.backends.sqlite3 import base

# One writer at a time per process, queued here rather than in SQLite. SQLite makes a waiting writer poll
# for the lock with growing sleeps (1, 2, 5 ... 100 ms): with a runner's many threads, the lock sat free
# while they slept, and a round of a hundred agents spent seconds of waiting on it. A thread here wakes as
# soon as the writer before it commits. Other processes (the web, another runner) still queue in SQLite.
WRITERS = threading.Lock()


class DatabaseWrapper(base.DatabaseWrapper):
    holds_writer = False  # this connection's transaction holds WRITERS

    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        name = str(conn_params.get("database", ""))
        if name and name != ":memory:" and not name.startswith("file:"):
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        return super().get_new_connection(conn_params)

    def _start_transaction_under_autocommit(self) -> None:
        # Bounded by the connection's own timeout: past it, SQLite decides as it did before (waits or fails).
        self.holds_writer = WRITERS.acquire(timeout=float(self.settings_dict["OPTIONS"].get("timeout", 5)))
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

    def writer_release(self) -> None:
        if self.holds_writer:
            self.holds_writer = False
            WRITERS.release()
