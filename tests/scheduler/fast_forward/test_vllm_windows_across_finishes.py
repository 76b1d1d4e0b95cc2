"""A vLLM decode stretch takes a window of steps' blocks at once across a finish among them
(scheduler/vllm/decode_stretches.py, schedule_until and _around_finishes): with async scheduling
a segment's first step's processing finishes the requests that leave, after that step's
schedule and before the next's. The window's blocks are taken before the finish frees blocks
to the back of the free queue; the blocks its steps fill enter the cache, and its evictions are
recorded, in stepping's order around the finish. Here on a pool the prefix cache fills (steps
evict on both sides of a finish), the run equals stepping's, and the bulk step-to-eviction map
equals the one-at-a-time one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_helpers import CountingLoop, assert_same_run, run_spaced_requests

from scheduler.vllm import decode_stretches, unhashed_blocks
from scheduler.vllm.config import VllmSchedulerConfig
from scheduler.vllm.scheduler import VllmScheduler


def _run(fast_forward: bool, kv_tokens: int) -> tuple[CountingLoop, VllmScheduler]:
    """24 requests 0.5 s apart, 50-300 prompt tokens, 100-400 outputs: blocks of 16, prefix
    caching, async scheduling, a pool of kv_tokens the cache fills."""
    sched = VllmScheduler(VllmSchedulerConfig(kv_tokens=kv_tokens, context_len=8192, overlap=True, page_size=16))
    return run_spaced_requests(sched, 24, 0.5, 7, fast_forward, True), sched


@pytest.mark.parametrize("flush_every_finish", [False, True])
@pytest.mark.parametrize("kv_tokens", [1800, 2500])
def test_a_window_across_a_finish_gives_the_run_that_stepping_gives(kv_tokens, flush_every_finish, monkeypatch):
    """flush_every_finish: each finish hashes every cached block (unhashed_blocks.py), those the
    window's steps before it filled (their tokens processed) and not those after."""
    if flush_every_finish:
        monkeypatch.setattr(unhashed_blocks, "MAX_FREED_RUNS", 0)
    windows = {"across": 0, "evicting_after": 0}
    around = decode_stretches._StretchRun._around_finishes

    def counting(self, reqs, steps, first, stop, evictions, cached_before):
        inside = [x for x in self.finish_steps if first <= x < stop - 1 and x >= self.processed]
        if inside:
            windows["across"] += 1
            windows["evicting_after"] += any(step > inside[0] for step, _ in evictions)
        around(self, reqs, steps, first, stop, evictions, cached_before)

    monkeypatch.setattr(decode_stretches._StretchRun, "_around_finishes", counting)
    ff_loop, ff_sched = _run(True, kv_tokens)
    step_loop, step_sched = _run(False, kv_tokens)
    assert windows["across"] >= 5, "no window of steps went across a finish"
    assert windows["evicting_after"] >= 1, "no window evicted after a finish among its steps"
    assert ff_loop.waits * 3 < step_loop.waits, (ff_loop.waits, step_loop.waits)
    assert_same_run(ff_loop, ff_sched, step_loop, step_sched)


@settings(max_examples=200, deadline=None)
@given(
    cycle=st.lists(st.integers(0, 5), min_size=1, max_size=16).filter(any),
    num_steps=st.integers(1, 200),
    first=st.integers(0, 50),
    data=st.data(),
)
def test_evictions_by_step_in_bulk_equal_a_step_at_a_time(cycle, num_steps, first, data):
    """The numpy path of _evictions_by_step (many evictions) gives what its loop gives."""
    total = (num_steps // len(cycle)) * sum(cycle) + sum(cycle[: num_steps % len(cycle)])
    if not total:
        return
    places = sorted(data.draw(st.sets(st.integers(0, total - 1), min_size=1, max_size=min(total, 300))))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(decode_stretches, "NUMPY_EVICTIONS", 1 << 30)
        looped = decode_stretches._evictions_by_step(first, cycle, places)
        mp.setattr(decode_stretches, "NUMPY_EVICTIONS", 0)
        assert decode_stretches._evictions_by_step(first, cycle, places) == looped
