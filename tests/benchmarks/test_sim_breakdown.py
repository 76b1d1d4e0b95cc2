"""benchmarks/sim_breakdown.py: every step a replay makes is in one of the pieces it times."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from scheduler.loop.event_loop import EventLoop
from scheduler.sglang.scheduler import Scheduler
from testbed.options import ReplayOptions
from testbed.traces.gen import GenConfig, generate_trace

ROOT = Path(__file__).resolve().parents[2]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("sim_breakdown", ROOT / "benchmarks" / "sim_breakdown.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fast_forward", [True, False])
def test_breakdown_accounts_for_every_step(tmp_path: Path, fast_forward: bool) -> None:
    bench = _load_benchmark()
    trace = tmp_path / "t.jsonl"
    generate_trace(GenConfig(num_requests=60, rate=2.0, seed=1)).write(trace)
    process, schedule = EventLoop._process, Scheduler.get_next_batch_to_run
    # Chunks of 64 tokens: prompts of 100-600 tokens take several prefill steps each.
    b = bench.measure(trace, ReplayOptions(fast_forward=fast_forward, chunked_prefill_size=64))
    assert EventLoop._process is process, "the loop was left instrumented"
    assert Scheduler.get_next_batch_to_run is schedule and "decode_stretch" not in Scheduler.__dict__, "the scheduler was left instrumented"
    seconds, counts = b.marks.totals()
    assert b.steps_seen() == b.summary["num_steps"]
    assert counts["prefill, chunk goes on"] > 0 and counts["prefill"] > 0
    assert (counts["decode stretch"] > 0) == fast_forward
    assert 0 < b.loop <= b.wall
    assert sum(seconds.values()) == pytest.approx(b.loop, rel=1e-6, abs=1e-3)
    # The scheduler's share: inside the loop, and it made every prompt (each once).
    assert 0 < b.marks.prompt_seconds < b.marks.core_seconds < b.loop
    assert b.marks.prompts == b.summary["completed"] == 60
