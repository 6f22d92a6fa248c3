"""Django's SQLite backend, creating the database file's folder when it first connects (a fresh checkout has
no var/ yet, and importing the settings must create nothing). The documented way to extend a built-in
backend: a DatabaseWrapper subclass named by ENGINE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        name = str(conn_params.get("database", ""))
        if name and name != ":memory:" and not name.startswith("file:"):
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        return super().get_new_connection(conn_params)
