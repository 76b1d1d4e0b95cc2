"""SimDriver: runs the scheduler's event loop on SimPy's clock.

CPU work is charged by the cost model and advances the loop's clock; a launch
charges the launch's CPU cost and queues the forward on the device stream
(forwards run one after another, each as long as the cost model says); awaiting
a result, or the next arrival, is a SimPy timeout to that time.

Fast-forward (on unless --no-fast-forward): every forward samples SIM_TOKEN_ID, so the loop
may ask to take a decode stretch at once (FastForward). _stretch_times runs the same float
operations, in the same order, as answering the stretch's waits one by one would (the
CpuWork, Launch and AwaitResult branches below), and cuts the stretch before the first
step whose schedule start reaches the next arrival; then one timeout lands SimPy's clock
exactly where the last of those waits would have.
"""

from __future__ import annotations

import gc
import math
from array import array
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generator, Iterator

import simpy

from scheduler.forward_plan import ForwardMode, ForwardPlan
from scheduler.ids import ids
from scheduler.loop import AwaitResult, CpuWork, EventLoop, FastForward, ForwardResult, Launch, StretchTimes, WaitForArrival
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
    def __init__(self, cost_model: CostModel, fast_forward: bool = True) -> None:
        self.cost_model = cost_model
        self.fast_forward = fast_forward
        self.env = simpy.Environment()
        self.device_free_at = 0.0
        # CPU time charged but not yet waited out. The loop is the only process, so
        # its CPU work needs no event of its own: it is folded into the next timeout,
        # and clock() counts it. One SimPy event per wait instead of one per stage.
        self.cpu_pending = 0.0

    def clock(self) -> float:
        return self.env.now + self.cpu_pending

    def run(self, loop: EventLoop) -> None:
        if self.fast_forward:
            loop.fast_forward_token = SIM_TOKEN_ID
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
            elif kind is FastForward:
                stretch = self._stretch_times(wait)
                if stretch is not None:
                    # The stretch ends on the clock where its last wait would have left it.
                    value, now, self.cpu_pending = stretch
                    yield timeout(self._delay_to(now))
                    self._land_on(now)
            elif kind is WaitForArrival:
                yield timeout(max(wait.until, self.clock()) - env.now)
                self.cpu_pending = 0.0
            else:
                raise TypeError(f"unknown wait {wait!r}")
        if self.cpu_pending:
            yield timeout(self.cpu_pending)
            self.cpu_pending = 0.0

    def _delay_to(self, t: float) -> float:
        """The largest delay d with env.now + d <= t (t - env.now may round either way)."""
        now = self.env.now
        d = t - now
        while now + d > t:
            d = math.nextafter(d, -math.inf)
        return d

    def _land_on(self, t: float) -> None:
        """Stepping reaches t by a chain of timeouts; one timeout from further back may not
        reach t exactly (env.now + d skips floats of t's parity when env.now is much smaller),
        so the clock is set to t: less than one ulp later, with no other event queued (the
        loop is SimPy's only process)."""
        env = self.env
        assert t - env.now <= math.ulp(t) and not env._queue, (env.now, t)
        env._now = t

    def _stretch_times(self, ff: FastForward) -> tuple[StretchTimes, float, float] | None:
        """The times of the stretch's steps, as answering each of their waits would stamp them,
        cut before the first step (after the first) whose schedule start reaches ff.next_arrival.
        None (and nothing changed) when fewer than two steps remain. Otherwise the times, and
        SimPy's time and the CPU time pending where the stretch ends (device_free_at is set)."""
        stretch, cost = ff.stretch, self.cost_model
        bs = stretch.batch_size
        overlap = ff.inflight is not None
        cs = cost.cpu_time("schedule", bs, bs)
        cl = cost.cpu_time("launch", bs, bs)
        cp = cost.cpu_time("process", bs, bs)
        # The cost model reads a decode plan's summaries only: one plan, its summaries set per step
        # (or all steps priced at once, where the cost model can: decode_forward_times).
        plan = ForwardPlan(ForwardMode.DECODE, [0] * bs, [], [], [], [], [], ids(), num_tokens=bs)
        bulk_price = getattr(cost, "decode_forward_times", None)
        durations = bulk_price(bs, stretch.sum_prefix_len, stretch.max_seq_len, stretch.max_steps).tolist() if bulk_price else None
        forward_time = cost.forward_time
        arrival = math.inf if ff.next_arrival is None else ff.next_arrival
        now, p, dfree = self.env.now, self.cpu_pending, self.device_free_at
        prev_end = ff.inflight.end if overlap else 0.0
        sum_prefix, max_seq = stretch.sum_prefix_len, stretch.max_seq_len
        t0s, t1s, t2s, starts, ends, t3s, t4s = cols = [array("d") for _ in range(7)]
        add_t0, add_t1, add_t2, add_start, add_end, add_t3, add_t4 = (c.append for c in cols)
        for j in range(stretch.max_steps):
            t0 = now + p
            if j and t0 >= arrival:
                break  # recv_requests(t0) would take the arrival: the stretch ends before this step
            p += cs  # CpuWork("schedule")
            t1 = now + p
            p += cl  # Launch
            start = max(t1, dfree)
            if durations is None:
                plan.sum_prefix_len = sum_prefix
                plan.sum_seq_len = sum_prefix + bs
                plan.attention_pairs = float(sum_prefix + bs)
                plan.max_seq_len = max_seq
                duration = forward_time(plan)
            else:
                duration = durations[j]
            end = max(start + duration, now + p)
            dfree = end
            t2 = now + p
            # AwaitResult: normal, of this step; overlap, of the one launched before.
            waited = prev_end if overlap else end
            now = now + (max(waited, now + p) - now)
            p = 0.0
            t3 = now + p
            p += cp  # CpuWork("process")
            t4 = now + p
            prev_end = end
            add_t0(t0)
            add_t1(t1)
            add_t2(t2)
            add_start(start)
            add_end(end)
            add_t3(t3)
            add_t4(t4)
            sum_prefix += bs
            max_seq += 1
        m = len(t0s)
        if m < 2:
            return None
        # The last step's summaries on the plan its handle carries.
        plan.sum_prefix_len = sum_prefix - bs
        plan.sum_seq_len = sum_prefix
        plan.attention_pairs = float(sum_prefix)
        plan.max_seq_len = max_seq - 1
        self.device_free_at = dfree
        inflight_device = (ff.inflight.start, ff.inflight.end) if overlap else None
        times = StretchTimes(m, t0s, t1s, t2s, starts, ends, t3s, t4s, SimForward(plan, starts[-1], ends[-1]), inflight_device)
        return times, now, p
