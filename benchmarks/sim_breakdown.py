"""Where a simulated replay's wall time goes, by what each turn of the event loop did.

    python benchmarks/sim_breakdown.py [--trace PATH] [--max-requests N] [--no-fast-forward] [--scheduler sglang|vllm]

Replays the trace once in this process (default: the Mooncake conversation trace, with
fast-forward) and gives the wall time from the start of each piece of a loop turn to the
start of the next to the kind of piece it was:

- decode stretch: decode steps taken at once (fast-forward), up to the last one's launch;
- prefill, chunk goes on: a prefill step (scheduled and launched) after which its chunked
  request still has prompt left (SGLang's scheduler; under vLLM's every one is a prefill);
- prefill: any other prefill step (mixed ones too);
- decode step: a decode step scheduled one at a time;
- processing: a step's result (with overlap, of the step launched before);
- no stretch: the fast-forward look that found no stretch to take;
- idle: nothing to run (the look that found nothing, and the wait for the next arrival);
- loop start: the driver's start before the first piece (with a full garbage collection where
  an earlier replay in the same process left its garbage: scheduler/loop/gc_pause.py).

Then the time outside the loop: loading the trace, and writing the run's tables. The
time of a piece includes the driver's: its costs, SimPy's events, the step log. Across the
pieces, the time inside the scheduler itself (the loop's calls to it: the decisions that
conformance pins to SGLang's), of which the prompts it makes from the trace when it first
needs them, and the rest of the loop. One run, on a noisy machine: compare shares and the
microseconds of a piece, not seconds across runs.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core.forward_plan import ForwardMode  # noqa: E402
from scheduler.loop.event_loop import EventLoop  # noqa: E402
from scheduler.sglang.decode_stretches import SglangDecodeStretches  # noqa: E402
from scheduler.sglang.scheduler import Scheduler  # noqa: E402
from scheduler.vllm.decode_stretches import VllmDecodeStretches  # noqa: E402
from scheduler.vllm.scheduler import VllmScheduler  # noqa: E402
from simulator.driver.sim_driver import SimDriver  # noqa: E402
from testbed.options import ReplayOptions  # noqa: E402
from testbed.replay import replay  # noqa: E402
from testbed.traces.schema import TracePrompts  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
STEP_KINDS = ("prefill, chunk goes on", "prefill", "decode step")  # a step scheduled one at a time
KINDS = ("loop start", "decode stretch", *STEP_KINDS, "processing", "no stretch", "idle")
# What the loop calls on a scheduler and on its decode stretches (scheduler/core/protocol.py's
# SchedulerCore and DecodeStretches; the end-of-run check_invariants is outside the loop).
CORE_METHODS = ("add_request", "get_next_batch_to_run", "launch", "process_batch_result", "on_idle", "is_idle", "kv_used_tokens")
STRETCH_METHODS = ("decode_stretch", "advance_decode_stretch")


@dataclass
class LoopMarks:
    """When each piece of a loop turn began, and what it turned out to be."""

    starts: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    stretch_steps: int = 0  # steps the stretches took
    loop_start: float = 0.0
    loop_end: float = 0.0
    # Inside the scheduler (its SchedulerCore methods, outermost calls only): the decisions
    # that conformance pins to SGLang's (or vLLM's), which every other piece waits on.
    core_seconds: float = 0.0
    core_calls: int = 0
    prompt_seconds: float = 0.0  # of which making prompts from the trace (done when first needed)
    prompts: int = 0
    _in_core: bool = False

    def begin(self) -> int:
        self.starts.append(time.perf_counter())
        self.kinds.append("")
        return len(self.kinds) - 1

    def totals(self) -> tuple[collections.Counter, collections.Counter]:
        seconds: collections.Counter = collections.Counter()
        counts: collections.Counter = collections.Counter()
        ends = self.starts[1:] + [self.loop_end]
        seconds["loop start"] = (self.starts[0] if self.starts else self.loop_end) - self.loop_start
        counts["loop start"] = 1
        for kind, t0, t1 in zip(self.kinds, self.starts, ends):
            seconds[kind] += t1 - t0
            counts[kind] += 1
        return seconds, counts


def _step_kind(launched: Any) -> str:
    if launched.plan.mode is ForwardMode.DECODE:
        return "decode step"
    return "prefill, chunk goes on" if getattr(launched, "chunked_req", None) is not None else "prefill"


def instrument(marks: LoopMarks) -> Callable[[], None]:
    """Wrap the loop's pieces (and the driver's run) to mark them; returns the undo."""
    originals = {name: getattr(EventLoop, name) for name in ("_schedule_and_launch", "_process", "_fast_forward", "_idle")}
    run = SimDriver.run

    def schedule_and_launch(self):
        i = marks.begin()
        inflight = yield from originals["_schedule_and_launch"](self)
        marks.kinds[i] = "idle" if inflight is None else _step_kind(inflight.launched)
        return inflight

    def process(self, f):
        marks.kinds[marks.begin()] = "processing"
        return (yield from originals["_process"](self, f))

    def fast_forward(self, prev):
        i = marks.begin()
        before = self._num_steps
        last = yield from originals["_fast_forward"](self, prev)
        marks.kinds[i] = "no stretch" if last is None else "decode stretch"
        marks.stretch_steps += self._num_steps - before
        return last

    def idle(self):
        if marks.kinds[-1] != "idle":  # (its schedule look, which found nothing, is marked already)
            marks.kinds[marks.begin()] = "idle"
        return (yield from originals["_idle"](self))

    def driver_run(self, loop):
        marks.loop_start = time.perf_counter()
        try:
            run(self, loop)
        finally:
            marks.loop_end = time.perf_counter()

    def core(f):
        def timed(*args, **kwargs):
            if marks._in_core:  # (a method calling another: counted once)
                return f(*args, **kwargs)
            marks._in_core = True
            t0 = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                marks.core_seconds += time.perf_counter() - t0
                marks.core_calls += 1
                marks._in_core = False

        return timed

    prompt = TracePrompts.prompt

    def timed_prompt(self, index):
        t0 = time.perf_counter()
        try:
            return prompt(self, index)
        finally:
            marks.prompt_seconds += time.perf_counter() - t0
            marks.prompts += 1

    EventLoop._schedule_and_launch, EventLoop._process = schedule_and_launch, process
    EventLoop._fast_forward, EventLoop._idle = fast_forward, idle
    SimDriver.run = driver_run
    # A method a class inherits (from SchedulerBase) is wrapped on the class itself, and removed
    # again by the undo; its own methods are put back.
    own = {(cls, name): cls.__dict__.get(name) for cls in (Scheduler, VllmScheduler) for name in CORE_METHODS}
    own |= {(cls, name): cls.__dict__.get(name) for cls in (SglangDecodeStretches, VllmDecodeStretches) for name in STRETCH_METHODS}
    for cls, name in own:
        setattr(cls, name, core(getattr(cls, name)))
    TracePrompts.prompt = timed_prompt

    def undo() -> None:
        for name, f in originals.items():
            setattr(EventLoop, name, f)
        SimDriver.run = run
        for (cls, name), f in own.items():
            if f is None:
                delattr(cls, name)
            else:
                setattr(cls, name, f)
        TracePrompts.prompt = prompt

    return undo


@dataclass
class Breakdown:
    trace: Path
    opts: ReplayOptions
    summary: dict
    wall: float
    marks: LoopMarks

    @property
    def loop(self) -> float:
        return self.marks.loop_end - self.marks.loop_start

    def steps_seen(self) -> int:
        """Steps the marked pieces launched: the stretches' and those scheduled one at a time."""
        _, counts = self.marks.totals()
        return self.marks.stretch_steps + sum(counts[k] for k in STEP_KINDS)


def measure(trace: Path, opts: ReplayOptions) -> Breakdown:
    """One replay (sim mode), its loop's pieces marked."""
    marks = LoopMarks()
    undo = instrument(marks)
    try:
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            result = replay(str(trace), opts, out=out)
            wall = time.perf_counter() - t0
    finally:
        undo()
    return Breakdown(trace, opts, result.summary, wall, marks)


def report(b: Breakdown) -> None:
    s, wall, loop, marks = b.summary, b.wall, b.loop, b.marks
    mode = "fast-forward" if b.opts.fast_forward else "step by step"
    print(
        f"{b.trace.name} ({b.opts.scheduler}, {mode}): {s['completed'] + s['rejected']:,} requests, {s['num_steps']:,} steps; "
        f"wall {wall:.2f} s: the loop {loop:.2f} s, outside it {wall - loop:.2f} s (loading the trace, writing the tables)"
    )
    seconds, counts = marks.totals()
    print(f"  {'piece':<24}{'count':>9}{'seconds':>10}{'share':>8}{'us each':>10}")
    for kind in KINDS:
        if counts[kind]:
            extra = (
                f"   ({marks.stretch_steps:,} steps, {marks.stretch_steps / counts[kind]:.1f} a stretch)"
                if kind == "decode stretch"
                else ""
            )
            print(
                f"  {kind:<24}{counts[kind]:>9,}{seconds[kind]:>10.3f}{seconds[kind] / wall:>8.1%}"
                f"{seconds[kind] / counts[kind] * 1e6:>10.1f}{extra}"
            )
    print(f"  {'outside the loop':<24}{'':>9}{wall - loop:>10.3f}{(wall - loop) / wall:>8.1%}")
    print(
        f"  across the pieces: inside the scheduler {marks.core_seconds:.3f} s ({marks.core_seconds / wall:.1%}, "
        f"{marks.core_calls:,} calls), of which making {marks.prompts:,} prompts {marks.prompt_seconds:.3f} s; "
        f"the rest of the loop (driver, clock, cost model, step log) {loop - marks.core_seconds:.3f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--fast-forward", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--scheduler", choices=("sglang", "vllm"), default="sglang")
    args = ap.parse_args()
    if not args.trace.exists():
        sys.exit(f"sim_breakdown: {args.trace}: no such trace file")
    report(measure(args.trace, ReplayOptions(max_requests=args.max_requests, fast_forward=args.fast_forward, scheduler=args.scheduler)))


if __name__ == "__main__":
    main()
