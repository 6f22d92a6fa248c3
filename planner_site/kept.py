"""`Kept`: values made once by a key and kept in memory, bounded (the least recently used goes first).

What the hot paths reuse within a process: rendered rows and graphs (planning/templatetags), statements
compiled once (planner_site/statements.py). Thread-safe; two threads may both make a missing value, and the
later one is kept (each is correct, so no lock is held while making it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from threading import Lock


class Kept[V]:
    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.values: OrderedDict[Hashable, V] = OrderedDict()
        self.lock = Lock()

    def get(self, key: Hashable, make: Callable[[], V]) -> V:
        with self.lock:
            value = self.values.get(key)
            if value is not None:
                self.values.move_to_end(key)
                return value
        value = make()
        with self.lock:
            self.values[key] = value
            while len(self.values) > self.kept:
                self.values.popitem(last=False)
        return value

    def clear(self) -> None:
        with self.lock:
            self.values.clear()
