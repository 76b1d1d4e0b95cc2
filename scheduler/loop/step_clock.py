"""The event loop on a logical clock: one forward is one step; no costs, no device.

A launched forward advances the clock by one; an idle wait moves it to the next arrival;
a forward "samples" what token_fn(req, output_index) says. At each launch the driver
records the scheduler's decision (StepRecord). The conformance harness (conformance/)
runs our scheduler this way against SGLang's, and tests use it to state a scheduling rule
as the steps it produces.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from scheduler.core.forward_plan import ForwardPlan
from scheduler.core.protocol import SchedulerCore
from scheduler.core.req import Req
from scheduler.loop.event_loop import (
    AwaitResult,
    CpuWork,
    EventLoop,
    ForwardResult,
    Launch,
    WaitForArrival,
)


@dataclass
class StepRecord:
    mode: str  # extend | decode | mixed
    reqs: list[tuple[str, int]]  # (rid, new tokens computed this step), in batch order
    retracted: list[str] = field(default_factory=list)  # retracted or preempted while scheduling it
    new_token_ratio: float = 0.0
    kv_used: int = 0  # KV slots held by requests or locked in the cache (not evictable, not free)
    kv_cached: int = 0  # evictable slots in the prefix cache
    num_waiting: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


class StepClockDriver:
    """Answers the loop's waits on a step clock, and records each launched batch."""

    def __init__(self, scheduler: SchedulerCore, token_fn: Callable[[Req, int], int]) -> None:
        self.scheduler = scheduler
        self.token_fn = token_fn
        self.now = 0.0
        self.steps: list[StepRecord] = []
        self._retractions: dict[str, int] = {}
        self.loop: EventLoop | None = None

    def clock(self) -> float:
        return self.now

    def run(self, loop: EventLoop, max_steps: int = 1_000_000) -> None:
        self.loop = loop
        gen = loop.run()
        value: Any = None
        while len(self.steps) < max_steps:
            try:
                wait = gen.send(value)
            except StopIteration:
                return
            value = None
            if isinstance(wait, CpuWork):
                continue
            if isinstance(wait, Launch):
                value = self._launch(wait.plan)
                self.now += 1
            elif isinstance(wait, AwaitResult):
                value = wait.handle
            elif isinstance(wait, WaitForArrival):
                self.now = max(self.now, wait.until)

    def _launch(self, plan: ForwardPlan) -> ForwardResult:
        sched = self.scheduler
        batch = sched.last_batch
        assert batch is not None and batch.plan is plan
        reqs = batch.reqs
        retracted = []
        for r in self.loop.received:
            if r.num_retractions != self._retractions.get(r.rid, 0):
                retracted.append(r.rid)
                self._retractions[r.rid] = r.num_retractions
        self.steps.append(
            StepRecord(
                mode=plan.mode.value,
                reqs=[(r.rid, n) for r, n in zip(reqs, plan.extend_lens)],
                retracted=sorted(retracted),
                new_token_ratio=round(sched.new_token_ratio, 9),
                kv_used=sched.kv_used_tokens(),
                kv_cached=sched.kv_cached_tokens(),
                num_waiting=len(sched.waiting_queue),
            )
        )
        # The token each request samples follows its last position (seq_len - 1).
        tokens = [self.token_fn(r, s - r.input_len) for r, s in zip(reqs, plan.seq_lens)]
        return ForwardResult(tokens, self.now, self.now + 1)


def run_steps(
    scheduler: SchedulerCore, reqs: Iterable[Req], token_fn: Callable[[Req, int], int], max_steps: int = 1_000_000
) -> tuple[StepClockDriver, EventLoop]:
    """Run reqs (in arrival order; arrival_time in steps) through the loop on the step clock."""
    driver = StepClockDriver(scheduler, token_fn)
    loop = EventLoop(scheduler, iter(reqs), driver.clock, scheduler.config.overlap)
    driver.run(loop, max_steps)
    return driver, loop
