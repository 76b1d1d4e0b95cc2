"""A vLLM decode stretch takes the blocks of a window of steps at once across its segments
(scheduler/vllm/decode_stretches.py, schedule_until): the requests that leave inside it are in
its first steps only (stretch_blocks.window_slots and filled_blocks take each request's own
steps), the finishes come in stepping's order around its filled blocks and evictions, and the
evictions of each segment's steps count from the window's first. Here: replays of bursts whose
requests leave one after another on a pool the cache fills, so that windows span finishes and
evict in several of their segments; the run equals stepping's. (The window's slots and filled
blocks with each request's own steps against stepping: tests/scheduler/vllm/test_stretch_blocks.py.)"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scheduler.vllm import decode_stretches
from testbed.options import ReplayOptions
from testbed.replay import replay
from testbed.runs.folder import load_run
from testbed.traces.schema import Trace, TraceRequest


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
