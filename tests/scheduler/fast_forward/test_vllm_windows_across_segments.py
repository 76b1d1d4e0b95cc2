"""A vLLM decode stretch takes the blocks of a window of steps at once across its segments
(scheduler/vllm/decode_stretches.py, schedule_until): the requests that leave inside it are in
its first steps only (stretch_blocks.window_slots and filled_blocks take each request's own
steps), the finishes come in stepping's order around its filled blocks and evictions, and the
evictions of each segment's steps count from the window's first. Here: the window's slots and
filled blocks against stepping one step at a time, and replays of bursts whose requests leave
one after another on a pool the cache fills, so that windows span finishes and evict in
several of their segments; the run equals stepping's."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.vllm import decode_stretches, stretch_blocks
from scheduler.vllm.stretch_blocks import filled_blocks, window_slots
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest


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


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), bs=st.integers(1, 9), most=st.integers(1, 70), ps=st.sampled_from([2, 4, 16]))
def test_a_window_across_segments_takes_the_slots_and_blocks_its_steps_take(seed, bs, most, ps):
    rng = random.Random(seed)
    seq_lens = [rng.randint(1, 200) for _ in range(bs)]
    steps = [rng.randint(1, most) for _ in range(bs)]
    last_slots = [rng.randint(0, 500) * ps + (s - 1) % ps for s in seq_lens]
    num_taken = sum(1 for s, n in zip(seq_lens, steps) for j in range(n) if (s + j) % ps == 0)
    taken = np.array(rng.sample(range(1000, 5000), num_taken), dtype=np.int64)
    want_slots, want_blocks = _stepped(seq_lens, last_slots, taken.tolist(), steps, ps)
    for few in (0, 100):  # numpy's way, then request by request
        old, stretch_blocks.FEW_REQUESTS = stretch_blocks.FEW_REQUESTS, few
        try:
            w = window_slots(seq_lens, last_slots, taken, steps, ps)
        finally:
            stretch_blocks.FEW_REQUESTS = old
        assert [list(np.frombuffer(memoryview(s).cast("B"), dtype=np.int64)) for s in w.slots] == want_slots
        assert [list(np.frombuffer(memoryview(b).cast("B"), dtype=np.int64)) for b in w.new_blocks] == want_blocks


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6), bs=st.integers(1, 9), most=st.integers(1, 70), ps=st.sampled_from([1, 4, 16]))
def test_filled_blocks_of_requests_leaving_at_their_own_steps(seed, bs, most, ps):
    """Each step caches the blocks its requests' known tokens fill, request after request, for
    the requests still in it."""
    rng = random.Random(seed)
    known = [rng.randint(1, 300) for _ in range(bs)]
    stops = [rng.randint(1, most) for _ in range(bs)]
    num_cached = [max(0, k // ps - rng.randint(0, 2)) for k in known]
    want, cached = [], list(num_cached)
    for step in range(max(stops)):
        for i in range(bs):
            if step >= stops[i]:
                continue
            full = (known[i] + step) // ps
            for b in range(cached[i], full):
                want.append((step, i, b))
            cached[i] = max(cached[i], full)
    assert filled_blocks(num_cached, known, stops, ps) == want


def _bursts(seed: int) -> Trace:
    """Requests of their own (their blocks fill the cache once they leave), then bursts of
    requests arriving together whose outputs end one after another."""
    rnd = random.Random(seed)
    requests, t = [], 0.0
    for i in range(60):
        prompt = list(range(1000 * (i + 1), 1000 * (i + 1) + rnd.randint(20, 120)))
        burst = i >= 20 and i % 8
        requests.append(TraceRequest(arrival_s=t, input_len=len(prompt), output_len=rnd.randint(10, 160), input_ids=prompt))
        t += 0.0 if burst else rnd.choice([0.3, 1.0])
    return Trace(requests=requests)


def _replay(trace_path: Path, out: Path, **opts):
    result = replay(str(trace_path), ReplayOptions(**opts), out=out)
    return result, load_run(out)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("page_size", [4, 16])
def test_windows_across_segments_give_the_run_that_stepping_gives(overlap, page_size, tmp_path, monkeypatch):
    seen = {"across": 0, "evicting_later": 0}
    evictions_of = decode_stretches._window_evictions

    def counting(window, evicted_at):
        evictions = evictions_of(window, evicted_at)
        if len(window) > 1:
            seen["across"] += 1
            # (an eviction before the second part and one past its first step, which a finish
            # there does not cover over)
            steps = [step for step, _ in evictions]
            seen["evicting_later"] += bool(steps) and steps[0] < window[1].first < steps[-1]
        return evictions

    monkeypatch.setattr(decode_stretches, "_window_evictions", counting)
    for seed in range(3):
        tmp = tmp_path / str(seed)
        tmp.mkdir()
        path = tmp / "trace.json"
        _bursts(seed).write(path)
        opts = dict(scheduler="vllm", overlap=overlap, page_size=page_size, kv_tokens=2400)
        step_res, step_run = _replay(path, tmp / "step", fast_forward=False, **opts)
        ff_res, ff_run = _replay(path, tmp / "ff", fast_forward=True, **opts)
        assert ff_res.summary == step_res.summary
        for name in ("steps", "requests"):
            a, b = getattr(step_run, name), getattr(ff_run, name)
            assert list(a.columns) == list(b.columns) and len(a) == len(b), name
            for c in a.columns:
                assert a[c].map(repr).tolist() == b[c].map(repr).tolist(), f"{name}.{c}"
    assert seen["across"] >= 10 and seen["evicting_later"] >= 3, seen
