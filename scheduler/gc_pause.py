"""gc_paused: no cyclic garbage collection inside a block.

The loop and the writing of a run's tables make many objects and few reference cycles;
CPython's collector, triggered by allocations, walks every object held (the cache's token
arrays, every request's lists) again and again: a quarter of a long simulated replay's
time, and a third of the time its tables took to write. Reference counting frees the rest
as usual; what cycles there are wait for the collector after the block."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
