"""A long-running process's collector (agents/runtime/heap.py): what it imported is frozen, and what it makes
afterwards is still collected, so a runner that runs for days keeps its memory."""

from __future__ import annotations

import gc
import weakref

from agents.runtime.heap import YOUNG_THRESHOLD, heap_freeze


class Node:
    peer: Node


def test_the_heap_frozen_at_start_still_collects_the_cycles_made_afterwards() -> None:
    threshold = gc.get_threshold()
    heap_freeze()
    assert gc.get_freeze_count() > 10_000  # Django, the apps and the SDKs imported by the test run
    assert gc.get_threshold() == threshold  # a web server keeps Python's
    heap_freeze(young_threshold=YOUNG_THRESHOLD)  # a runner's
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *threshold[1:])

    a, b = Node(), Node()
    a.peer, b.peer = b, a  # a reference cycle: only the collector frees it
    gone = weakref.ref(a)
    del a, b
    gc.collect()

    assert gone() is None
