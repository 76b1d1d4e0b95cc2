"""The event loop, written once, as a generator of waits ("one loop, two clocks").

The loop yields what it waits for; a driver answers:

- CpuWork(stage, num_reqs, num_tokens): the loop has just done this CPU work.
  The simulator charges its cost (a timeout); the real engine did it, so it
  only lets the clock run. The driver sends back nothing.
- Launch(plan): start this forward on the device: the CPU work of launching it
  happens (or is charged) in the driver. The driver sends back a handle.
- AwaitResult(handle): wait for that forward. The driver sends back a ForwardResult.
- WaitForArrival(until): nothing to do before `until` (the next arrival).

`clock()` reads the driver's clock (SimPy's env.now, or wall seconds since the
start), so the loop stamps every event in the time of whichever clock runs it.

Normal mode: schedule -> launch -> wait -> process. Overlap mode (SGLang's
zero-overhead scheduler): schedule and launch batch N+1, then process batch N
while N+1 runs. A request whose in-flight step reaches its length gets no further
step (the scheduler sees it in flight); a stop at EOS is seen one step late, and
the token its extra step produced is dropped.
"""

from __future__ import annotations

import itertools

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator

from scheduler.forward_plan import ForwardPlan
from scheduler.protocol import Launched, SchedulerCore
from scheduler.req import Req
from scheduler.step_log import StepLog


@dataclass(slots=True)
class CpuWork:
    stage: str  # "schedule" | "launch" | "process"
    num_reqs: int
    num_tokens: int


@dataclass(slots=True)
class Launch:
    plan: ForwardPlan


@dataclass(slots=True)
class AwaitResult:
    handle: Any


@dataclass(slots=True)
class WaitForArrival:
    until: float


@dataclass(slots=True)
class ForwardResult:
    next_token_ids: list[int]
    device_start: float  # in the driver's clock
    device_end: float


Wait = CpuWork | Launch | AwaitResult | WaitForArrival


@dataclass(slots=True)
class _InFlight:
    launched: Launched
    handle: Any
    step: int
    schedule_start: float
    schedule_end: float
    launch_end: float


class DeadlockError(RuntimeError):
    pass


class EventLoop:
    def __init__(
        self,
        scheduler: SchedulerCore,
        requests: Iterator[Req],
        clock: Callable[[], float],
        overlap: bool,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.requests = requests
        self.clock = clock
        self.overlap = overlap
        self.progress = progress
        self.steps = StepLog()
        self.received: list[Req] = []  # every request handed to the scheduler, in arrival order
        self._next_req: Req | None = next(requests, None)
        self._num_steps = 0

    # -- arrivals -------------------------------------------------------------------
    def recv_requests(self, now: float) -> None:
        nxt = self._next_req
        while nxt is not None and nxt.arrival_time <= now:
            self.received.append(nxt)
            self.scheduler.add_request(nxt)
            nxt = next(self.requests, None)
        self._next_req = nxt

    def next_arrival(self) -> float | None:
        return None if self._next_req is None else self._next_req.arrival_time

    # -- one step's pieces ----------------------------------------------------------
    def _schedule_and_launch(self) -> Generator[Wait, Any, _InFlight | None]:
        sched = self.scheduler
        t0 = self.clock()
        self.recv_requests(t0)
        batch = sched.get_next_batch_to_run()
        if batch is None:
            return None
        plan = batch.plan
        yield CpuWork("schedule", plan.batch_size, plan.num_tokens)
        t1 = self.clock()
        launched = sched.launch(batch, t1, self.overlap)
        handle = yield Launch(plan)  # the driver does (or charges) the CPU side of the launch
        t2 = self.clock()
        self._num_steps += 1
        return _InFlight(launched, handle, self._num_steps, t0, t1, t2)

    def _process(self, f: _InFlight) -> Generator[Wait, Any, None]:
        sched = self.scheduler
        result: ForwardResult = yield AwaitResult(f.handle)
        t3 = self.clock()
        sched.process_batch_result(f.launched, result.next_token_ids, t3)
        plan = f.launched.plan
        yield CpuWork("process", plan.batch_size, plan.num_tokens)
        t4 = self.clock()
        self.steps.append(
            f.step,
            plan.mode.value,
            plan.batch_size,
            plan.num_tokens,
            plan.sum_prefix_len,
            f.launched.cache_hit_tokens,
            f.schedule_start,
            f.schedule_end,
            f.schedule_end,
            f.launch_end,
            result.device_start,
            result.device_end,
            t3,
            t4,
            sched.kv_used_tokens(),
            sched.tree_cache.evictable_size(),
            sched.running_batch.batch_size(),
            len(sched.waiting_queue),
            f.launched.num_retracted,
            plan.max_seq_len,
            plan.attention_pairs,
        )
        if self.progress is not None:
            self.progress(len(sched.done))

    def _idle(self) -> Generator[Wait, Any, bool]:
        """Nothing runs. Wait for the next arrival; False when the run is over."""
        sched = self.scheduler
        sched.on_idle()
        nxt = self.next_arrival()
        if nxt is None:
            if sched.is_idle():
                return False
            waiting = ", ".join(r.rid for r in itertools.islice(sched.waiting_queue, 5))
            raise DeadlockError(
                f"{len(sched.waiting_queue)} requests wait but none can ever be scheduled ({waiting}); "
                "the scheduler's admission rules refuse them on this KV pool (a larger --kv-tokens, or the radix cache on, admits them)"
            )
        yield WaitForArrival(nxt)
        return True

    # -- the loops --------------------------------------------------------------------
    def run(self) -> Generator[Wait, Any, None]:
        if self.overlap:
            yield from self._run_overlap()
        else:
            yield from self._run_normal()

    def _run_normal(self) -> Generator[Wait, Any, None]:
        while True:
            inflight = yield from self._schedule_and_launch()
            if inflight is not None:
                yield from self._process(inflight)
            elif not (yield from self._idle()):
                return

    def _run_overlap(self) -> Generator[Wait, Any, None]:
        pending: deque[_InFlight] = deque()
        while True:
            inflight = yield from self._schedule_and_launch()
            if inflight is not None:
                pending.append(inflight)
            # Process the previous batch while the one just launched runs.
            if pending and (inflight is None or len(pending) > 1):
                yield from self._process(pending.popleft())
            elif inflight is None and not (yield from self._idle()):
                return
