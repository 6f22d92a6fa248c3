"""The cyclic garbage collector in a long-running process (`serve`, `runagents`).

Everything imported by the time a process starts its work (Django, its apps, the SDKs' schemas: hundreds of
thousands of objects) lives as long as the process. Left to the collector, each full pass walks all of it: in a
runner under the 1,000-persona scale bench, 10-12 full passes of 0.1-0.13 s each, and 7-10 % of its CPU in all
went to collection; in the web server a full pass stalled a push for tens of ms. `gc.freeze()` moves those
objects to the permanent generation, which the collector never walks.

A runner's pass then builds thousands of model instances that live as long as the pass: with Python's threshold
(a collection of the youngest generation every 2,000 net allocations) they are walked again and again while
they are young and moved on to the older generations. With YOUNG_THRESHOLD most die before a collection sees
them. Measured with `gc.callbacks` in both runners of the scale bench (`make bench`, scale_1000_cpu_per_cycle;
docs/performance.md): collection took 7.5-10 % of a runner's CPU before, 5-6.5 % frozen, 3.4 % frozen with
20,000 and 1-2 % with 100,000 (a collection then takes ~3 ms).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 100_000  # a runner's: net allocations between collections of the youngest generation (Python's: 2,000)


def heap_freeze(*, young_threshold: int | None = None) -> None:
    """Collect once and keep every object alive now out of the collector's passes; with `young_threshold`,
    collect the youngest generation every that many net allocations (the older generations' thresholds stay
    Python's). Call it once the process has imported what its work needs, before the work starts.

    `runagents` passes YOUNG_THRESHOLD; `serve` does not: a page's latency would take a larger collection at
    once, and its figures were measured with Python's threshold."""
    gc.collect()
    gc.freeze()
    if young_threshold is not None:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(young_threshold, older, oldest)
