"""A window of a vLLM decode stretch's steps (decode_stretches.py) done at once: the KV slots
each request's tokens take, and the full blocks that enter the prefix cache, as stepping gives
them, in a few vector operations instead of a Python loop over steps and requests.

Steps s .. s + n - 1 decode the same requests (request i's sequence seq_lens[i] long before
step s), each one token a step. Stepping's step j gives each request the slot after its last
one, but a request whose length is a multiple of the block size takes a new block first,
from the front of the free queue, in request order: the window's blocks, taken at once, are
those of step s's takers, then step s + 1's, and so on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from scheduler.core.ids import extend_range, ids

# Windows of at most this many requests are done in Python: below it a loop over the
# requests' few runs of slots costs less than numpy's twenty calls (~15 us).
FEW_REQUESTS = 3


@dataclass(slots=True)
class WindowSlots:
    slots: list  # each request's slots, one a step (int64 buffers)
    new_blocks: list  # each request's blocks taken, in step order (int64 buffers)


def window_slots(
    seq_lens: list[int], last_slots: list[int], taken: np.ndarray, num_steps: int | Sequence[int], page_size: int
) -> WindowSlots:
    """The slots of num_steps decode steps, given the requests' lengths and last slots before
    them and the blocks the steps take (in taking order: step after step, request order).
    num_steps may be each request's own: request i is in the first num_steps[i] steps (a window
    across finishes: those leaving before its end are in its first steps only)."""
    steps = [num_steps] * len(seq_lens) if isinstance(num_steps, int) else list(num_steps)
    if len(seq_lens) <= FEW_REQUESTS:
        return _few_window_slots(seq_lens, last_slots, taken.tolist(), steps, page_size)
    ps, bs, n = page_size, len(seq_lens), max(steps)
    positions = np.array(seq_lens, dtype=np.int64)[:, None] + np.arange(n)
    offsets = positions % ps
    takes = offsets == 0  # [request, step]: it takes a block (its position starts one)
    if min(steps) < n:
        takes &= np.arange(n) < np.array(steps, dtype=np.int64)[:, None]  # (and is in that step)
    block = np.empty(takes.shape, dtype=np.int64)
    block[:, 0] = np.array(last_slots, dtype=np.int64) // ps  # (where it takes none at the first step: its last block)
    block.T[takes.T] = taken  # (in step order, then request order)
    # Every step's block: the last one taken up to it.
    latest = np.where(takes, np.arange(n), 0)
    np.maximum.accumulate(latest, axis=1, out=latest)
    latest += np.arange(0, bs * n, n)[:, None]
    slots = block.ravel().take(latest) * ps + offsets
    counts = np.count_nonzero(takes, axis=1).tolist()
    new, at = block[takes], 0
    new_blocks = []
    for k in counts:
        new_blocks.append(new[at : at + k])
        at += k
    rows = list(slots) if min(steps) == n else [row[:k] for row, k in zip(slots, steps)]
    return WindowSlots(rows, new_blocks)


def _few_window_slots(seq_lens: list[int], last_slots: list[int], taken: list[int], steps: list[int], page_size: int) -> WindowSlots:
    """window_slots request by request: the slots after its last one up to its block's end,
    then each block it takes, filled."""
    ps = page_size
    takers = sorted(
        ((-s) % ps + k * ps, i) for i, (s, n) in enumerate(zip(seq_lens, steps)) for k in range(max(0, -(-(n - (-s) % ps) // ps)))
    )
    new_blocks = [ids() for _ in seq_lens]
    for (_, i), b in zip(takers, taken):
        new_blocks[i].append(b)
    slots = []
    for s, last, blocks, n in zip(seq_lens, last_slots, new_blocks, steps):
        row = ids()
        run = min((-s) % ps, n)
        extend_range(row, last + 1, last + 1 + run)
        left = n - run
        for b in blocks:
            run = min(ps, left)
            extend_range(row, b * ps, b * ps + run)
            left -= run
        slots.append(row)
    return WindowSlots(slots, new_blocks)


def filled_blocks(num_cached: list[int], known: list[int], stop: int | Sequence[int], page_size: int) -> list[tuple[int, int, int]]:
    """The blocks that fill before step `stop`, in the order stepping caches them: request i
    knows known[i] tokens at step 0 and one more each step, and its first num_cached[i] blocks
    are cached; its block b is cached at step max(0, (b + 1) * page_size - known[i]) (stepping
    caches a step's full blocks request after request). stop may be each request's own (it is
    in the steps before). Returns (step, request, block index) of each, in that order. (A
    window fills about one block a request: a loop over so few costs less than numpy's calls.)"""
    ps = page_size
    stops = [stop] * len(known) if isinstance(stop, int) else stop
    filled = [
        ((b + 1) * ps - k if (b + 1) * ps > k else 0, i, b)
        for i, (c, k, t) in enumerate(zip(num_cached, known, stops))
        for b in range(c, (k + t - 1) // ps)
    ]
    filled.sort()
    return filled
