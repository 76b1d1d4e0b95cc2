"""A decode stretch's window done at once (scheduler/vllm/stretch_blocks.py) against the same
steps taken one by one: the slots each request's tokens take, the blocks each takes, and the
blocks that fill, in caching order; with the same steps for every request, and with each
request's own (a window across a stretch's segments, where requests leave inside it)."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.vllm import stretch_blocks
from scheduler.vllm.stretch_blocks import filled_blocks, window_slots


def _stepped(seq_lens, last_slots, taken, steps, ps):
    """Step after step, request after request (those still in the step): the slot after the
    last one, or the first slot of the next block taken when the position starts a block."""
    taking = iter(taken)
    slots = [[] for _ in seq_lens]
    blocks = [[] for _ in seq_lens]
    last, lens = list(last_slots), list(seq_lens)
    for j in range(max(steps)):
        for i in range(len(lens)):
            if j >= steps[i]:
                continue
            if lens[i] % ps == 0:
                b = next(taking)
                blocks[i].append(b)
                last[i] = b * ps
            else:
                last[i] += 1
            slots[i].append(last[i])
            lens[i] += 1
    assert next(taking, None) is None
    return slots, blocks


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    bs=st.integers(1, 9),
    most=st.integers(1, 70),
    ps=st.sampled_from([2, 4, 16]),
    alike=st.booleans(),
)
def test_a_window_takes_the_slots_and_blocks_its_steps_take(seed, bs, most, ps, alike):
    """Every request in all the window's steps (alike: window_slots given their number), or each
    in its own first steps (a window across segments, where requests leave inside it)."""
    rng = random.Random(seed)
    seq_lens = [rng.randint(1, 200) for _ in range(bs)]
    steps = [most] * bs if alike else [rng.randint(1, most) for _ in range(bs)]
    last_slots = [rng.randint(0, 500) * ps + (s - 1) % ps for s in seq_lens]
    num_taken = sum(1 for s, n in zip(seq_lens, steps) for j in range(n) if (s + j) % ps == 0)
    taken = np.array(rng.sample(range(1000, 5000), num_taken), dtype=np.int64)
    want_slots, want_blocks = _stepped(seq_lens, last_slots, taken.tolist(), steps, ps)
    for few in (0, 100):  # numpy's way, then request by request
        old, stretch_blocks.FEW_REQUESTS = stretch_blocks.FEW_REQUESTS, few
        try:
            w = window_slots(seq_lens, last_slots, taken, most if alike else steps, ps)
        finally:
            stretch_blocks.FEW_REQUESTS = old
        assert [list(np.frombuffer(memoryview(s).cast("B"), dtype=np.int64)) for s in w.slots] == want_slots
        assert [list(np.frombuffer(memoryview(b).cast("B"), dtype=np.int64)) for b in w.new_blocks] == want_blocks


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    bs=st.integers(1, 9),
    most=st.integers(1, 70),
    ps=st.sampled_from([1, 4, 16]),
    alike=st.booleans(),
)
def test_filled_blocks_come_in_the_order_steps_cache_them(seed, bs, most, ps, alike):
    """Each step caches the blocks its requests' known tokens fill, request after request, for
    the requests still in it (alike: all of them to the window's end, filled_blocks given it)."""
    rng = random.Random(seed)
    known = [rng.randint(1, 300) for _ in range(bs)]
    stops = [most] * bs if alike else [rng.randint(1, most) for _ in range(bs)]
    num_cached = [max(0, k // ps - rng.randint(0, 2)) for k in known]  # (some behind their tokens)
    want, cached = [], list(num_cached)
    for step in range(max(stops)):
        for i in range(bs):
            if step >= stops[i]:
                continue
            full = (known[i] + step) // ps
            for b in range(cached[i], full):
                want.append((step, i, b))
            cached[i] = max(cached[i], full)
    assert filled_blocks(num_cached, known, most if alike else stops, ps) == want
