"""Python's cyclic garbage collector, paused around work that builds many objects it cannot free.

A cycle builds its Session, Plan and search views — at 20,000 nodes hundreds of thousands of
objects, alive until the cycle ends. Each collection the cycle's allocations set off walks them
all again and frees none; measured on `tools/bench/bench_steady_cycle.py` at 20,000 nodes, the
collections inside a cycle cost 60-390 ms of a 0.8-1.6 s cycle, growing as the process ran.
Paused, the cycle allocates without them; what it leaves (its objects, some held in reference
cycles: a Plan's listeners hold their Session) is young when collection resumes, and the next
young collection frees it.

Contract: `collector_paused()` disables automatic collection for its block and restores the
previous setting after (nested uses and an already disabled collector are left as they were);
with `freeze=True`, everything allocated so far is moved out of the collector's reach
(`gc.freeze`) before collection resumes. Decisions never depend on it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """Automatic collection off for the block (module docstring)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()
