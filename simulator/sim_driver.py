"""SimDriver: runs the scheduler's event loop on SimPy's clock.

CPU work is charged by the cost model and advances the loop's clock; a launch
charges the launch's CPU cost and queues the forward on the device stream
(forwards run one after another, each as long as the cost model says); awaiting
a result, or the next arrival, is a SimPy timeout to that time.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generator, Iterator

import simpy

from scheduler.forward_plan import ForwardPlan
from scheduler.loop import AwaitResult, CpuWork, EventLoop, ForwardResult, Launch, WaitForArrival
from simulator.cost_model import CostModel

# The simulator samples no tokens: traces fix output lengths. Every sampled id is this.
SIM_TOKEN_ID = 0


@dataclass(slots=True)
class SimForward:
    plan: ForwardPlan
    start: float
    end: float


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC while the loop runs: its full passes walk every token list held
    (the cache, the prompts) and took a quarter of a long replay's time. The loop
    makes few reference cycles; reference counting frees the rest as usual."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class SimDriver:
    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        self.env = simpy.Environment()
        self.device_free_at = 0.0
        # CPU time charged but not yet waited out. The loop is the only process, so
        # its CPU work needs no event of its own: it is folded into the next timeout,
        # and clock() counts it. One SimPy event per wait instead of one per stage.
        self.cpu_pending = 0.0

    def clock(self) -> float:
        return self.env.now + self.cpu_pending

    def run(self, loop: EventLoop) -> None:
        self.env.process(self._drive(loop.run()))
        with gc_paused():
            self.env.run()

    def _drive(self, gen: Generator) -> Generator[simpy.Event, Any, None]:
        env, cost = self.env, self.cost_model
        timeout = env.timeout
        value: Any = None
        while True:
            try:
                wait = gen.send(value)
            except StopIteration:
                break
            value = None
            kind = type(wait)
            if kind is CpuWork:
                self.cpu_pending += cost.cpu_time(wait.stage, wait.num_reqs, wait.num_tokens)
            elif kind is Launch:
                plan = wait.plan
                launch_start = self.clock()
                self.cpu_pending += cost.cpu_time("launch", plan.batch_size, plan.num_tokens)
                # Kernels start as soon as the first is launched and the stream is free,
                # but the forward cannot end before its last kernel was launched.
                start = max(launch_start, self.device_free_at)
                duration = cost.forward_time(plan)
                end = max(start + duration, self.clock())
                self.device_free_at = end
                value = SimForward(plan, start, end)
            elif kind is AwaitResult:
                fwd: SimForward = wait.handle
                yield timeout(max(fwd.end, self.clock()) - env.now)
                self.cpu_pending = 0.0
                value = ForwardResult([SIM_TOKEN_ID] * fwd.plan.batch_size, fwd.start, fwd.end)
            elif kind is WaitForArrival:
                yield timeout(max(wait.until, self.clock()) - env.now)
                self.cpu_pending = 0.0
            else:
                raise TypeError(f"unknown wait {wait!r}")
        if self.cpu_pending:
            yield timeout(self.cpu_pending)
            self.cpu_pending = 0.0
