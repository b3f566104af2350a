"""A cycle runs with Python's cyclic garbage collector paused.

A cycle builds a large graph of short-lived objects (candidates, victim units, lists, heaps)
that point into the state, and makes no reference cycle of its own (`PoolCycle.close` breaks
the one it made): reference counting frees all of it when `decide` returns. A collection
during a cycle therefore finds nothing, yet it walks every object the cycle made so far and
reads the header of every state object they point to, long out of the processor's cache.
With the state frozen (`gc.freeze()`, as the deciders do after replaying the log), the burst
cycle at 4x the bench's size ran about 124 young, 11 middle and one full collection a cycle,
73 ms of its 470 (8.6 ms of 90 at 1x), and found no garbage in any of them: the full
collections come about once per 70,000 allocations and walk everything the cycle holds, so
their cost grew with the square of the cluster's size.

The pause counts nothing away: allocations made meanwhile still count towards the next
collection, which runs as usual once the cycle is over, and a test checks that a cycle leaves
no garbage behind for it (`tests/test_collector.py`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The collector paused inside, and as it was (on or off) after, even on an error."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
