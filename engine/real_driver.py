"""RealDriver: runs the scheduler's event loop on the wall clock with a real model.

CPU work the loop yields has just happened, so it is timed, not charged. A
launch runs the forward:
- without overlap, right away, and the result waits for the loop;
- with overlap on the CPU, on one worker thread, so that the loop schedules the
  next batch while torch computes (torch releases the GIL inside its kernels);
- with overlap on CUDA, on a forward stream: the sampled ids are copied to pinned
  memory and an event marks when they are there; device time comes from CUDA events.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generator

import torch

from engine.model_runner import ModelRunner
from scheduler.core.forward_plan import ForwardPlan
from scheduler.loop.event_loop import AwaitResult, CpuWork, EventLoop, ForwardResult, Launch, WaitForArrival


@dataclass
class _Inflight:
    plan: ForwardPlan
    future: Future | None = None  # CPU overlap
    ids: torch.Tensor | None = None  # pinned host copy (CUDA) or result (CPU, no overlap)
    done: Any = None  # CUDA event: ids are on the host
    start_event: Any = None
    end_event: Any = None
    start: float = 0.0  # wall clock, CPU paths
    end: float = 0.0


class RealDriver:
    def __init__(self, runner: ModelRunner, overlap: bool) -> None:
        self.runner = runner
        self.overlap = overlap
        self.cuda = runner.device.type == "cuda"
        self.t0 = time.perf_counter()
        # How the loop waits for its next arrival (seconds): a server's driver wakes early when a
        # request comes in (testbed/live/serve.py).
        self.sleep = time.sleep
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="forward") if overlap and not self.cuda else None
        if self.cuda:
            self.stream = torch.cuda.Stream(runner.device) if overlap else torch.cuda.current_stream(runner.device)
            # Device times are read as offsets from this event, recorded at the wall-clock origin.
            self.origin = torch.cuda.Event(enable_timing=True)

    def _start_clock(self) -> None:
        """Time 0 is when the loop starts: the trace's first arrival."""
        if self.cuda:
            torch.cuda.synchronize(self.runner.device)
            self.origin.record(self.stream)
        self.t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def run(self, loop: EventLoop) -> None:
        self._start_clock()
        try:
            self._drive(loop.run())
        finally:
            if self.worker is not None:
                self.worker.shutdown(wait=True)

    def _drive(self, gen: Generator) -> None:
        value: Any = None
        while True:
            try:
                wait = gen.send(value)
            except StopIteration:
                return
            value = None
            kind = type(wait)
            if kind is CpuWork:
                pass  # it ran on this thread; the loop read the clock around it
            elif kind is Launch:
                value = self._launch(wait.plan)
            elif kind is AwaitResult:
                value = self._await(wait.handle)
            elif kind is WaitForArrival:
                delay = wait.until - self.clock()
                if delay > 0:
                    self.sleep(delay)
            else:
                raise TypeError(f"unknown wait {wait!r}")

    def _timed_forward(self, f: _Inflight) -> None:
        f.start = self.clock()
        f.ids = self.runner.forward(f.plan)
        f.end = self.clock()

    def _launch(self, plan: ForwardPlan) -> _Inflight:
        f = _Inflight(plan)
        if self.cuda:
            with torch.cuda.stream(self.stream):
                f.start_event = torch.cuda.Event(enable_timing=True)
                f.end_event = torch.cuda.Event(enable_timing=True)
                f.start_event.record()
                ids = self.runner.forward(plan)
                f.end_event.record()
                f.ids = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
                f.ids.copy_(ids, non_blocking=True)
                f.done = torch.cuda.Event()
                f.done.record()
        elif self.worker is not None:
            f.future = self.worker.submit(self._timed_forward, f)
        else:
            self._timed_forward(f)
        return f

    def _await(self, f: _Inflight) -> ForwardResult:
        if self.cuda:
            f.done.synchronize()
            start = self.origin.elapsed_time(f.start_event) / 1e3
            end = self.origin.elapsed_time(f.end_event) / 1e3
        else:
            if f.future is not None:
                f.future.result()
            start, end = f.start, f.end
        assert f.ids is not None
        return ForwardResult(f.ids.tolist(), start, end)
