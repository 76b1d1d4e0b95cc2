"""gc_paused: no cyclic garbage collection inside a block.

The loop and the writing of a run's tables make many objects and few reference cycles;
CPython's collector, triggered by allocations, walks every object held (the cache's token
arrays, every request's lists) again and again: a quarter of a long simulated replay's
time, and a third of the time its tables took to write. Reference counting frees the rest
as usual.

At the end of the block the objects it made are still in the youngest generation, so the
first allocation after it would walk them all (15-20 ms after the light trace's replay, as
long as a sixth of its tables). Instead they join the oldest generation as they are
(gc.freeze then gc.unfreeze: two list splices, no walk). The cycles among them (a run's
radix tree, its loop) are then garbage that only a full collection finds, and the full
collections that CPython triggers by itself count only what survived younger ones: so the
next block starts with one (gc.collect), which a process that replays once (the CLI) never
pays, and one that replays many times (a study) pays once a run, as it did before.
(gc.unfreeze also returns objects that someone else froze to the oldest generation.)

A process that replays hundreds of times (validate's workers) holds much beside the runs: kernel
profiles, the points, AIConfigurator's tables. A full collection walks them all before every
replay, 40-50 ms each time. freeze_held() moves what the process holds to the permanent generation
for good, and gc_paused then leaves the permanent generation alone: its blocks' objects stay young.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

# A block has ended since the last full collection: its cyclic garbage waits for one.
_collect_before_next = False
# freeze_held() has moved what the process holds to the permanent generation: keep it there.
_held_frozen = False


def freeze_held() -> None:
    """Collect, then move every object the process still holds to the permanent generation, which
    no collection walks (call it again after holding more; garbage is collected first, not frozen)."""
    global _collect_before_next, _held_frozen
    gc.collect()
    gc.freeze()
    _collect_before_next = False
    _held_frozen = True


@contextmanager
def gc_paused(collect_earlier: bool = True) -> Iterator[None]:
    """collect_earlier=False: a block that continues the one before (a run's tables after its
    loop), whose objects are all in use: a full collection would walk them for nothing."""
    global _collect_before_next
    was_enabled = gc.isenabled()
    if was_enabled and _collect_before_next and collect_earlier:
        gc.collect()
        _collect_before_next = False
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not _held_frozen:
                gc.freeze()  # every tracked object, this block's too, to the permanent generation...
                gc.unfreeze()  # ...and from there to the oldest
            _collect_before_next = True
            gc.enable()
