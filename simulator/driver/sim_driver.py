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

import math
from dataclasses import dataclass
from typing import Any, Callable, Generator

import numpy as np
import simpy

from scheduler.core.forward_plan import ForwardMode, ForwardPlan
from scheduler.core.ids import ids
from scheduler.fast_forward.decode_stretch import DecodeStretch, StretchSegment
from scheduler.loop.event_loop import AwaitResult, CpuWork, EventLoop, FastForward, ForwardResult, Launch, StretchTimes, WaitForArrival
from scheduler.loop.gc_pause import gc_paused
from simulator.costs.cost_model import CostModel
from simulator.driver.stretch_clock import DriverClock, StepCosts, StretchColumns, scalar_steps, vector_steps

# The simulator samples no tokens: traces fix output lengths. Every sampled id is this.
SIM_TOKEN_ID = 0
# A stretch's steps are timed in bulk (stretch_clock.py) where more than this many remain before
# its end and the next arrival, else one at a time: about where numpy's fixed cost (~15 us) and
# the loop's cost per step (~0.5 us) meet.
BULK_MIN_STEPS = 20


@dataclass(slots=True)
class SimForward:
    plan: ForwardPlan
    start: float
    end: float


class LandingEnvironment(simpy.Environment):
    """SimPy's environment, whose clock a decode stretch can set to the time its last step lands
    on (SimDriver._land_on): only less than one ulp ahead, and only when no queued event comes
    before it, so none is passed over. With one loop nothing else is queued and it always lands;
    beside other instances' loops (a cluster) an event of theirs inside that ulp leaves the
    clock where it is, under an ulp early."""

    def land_on(self, t: float) -> None:
        assert t - self.now <= math.ulp(t), (self.now, t)
        if self._queue and self._queue[0][0] < t:
            return
        self._now = t


class SimDriver:
    def __init__(
        self, cost_model: CostModel, fast_forward: bool = True, env: LandingEnvironment | None = None, wakeable: bool = False
    ) -> None:
        self.cost_model = cost_model
        self.fast_forward = fast_forward
        # Its own clock; or one it shares with the other instances of a cluster (simulator/cluster/).
        self.env = env if env is not None else LandingEnvironment()
        # An instance of a prefill/decode pair (simulator/cluster/pd.py) learns of some events only
        # as they happen (a request whose KV has arrived): its idle wait for the next arrival also
        # ends at wake(). Its loop's next arrival is then math.inf where no time is known.
        self.wakeable = wakeable
        self._wake: simpy.Event | None = None
        self.device_free_at = 0.0
        # CPU time charged but not yet waited out. The loop is the only process, so
        # its CPU work needs no event of its own: it is folded into the next timeout,
        # and clock() counts it. One SimPy event per wait instead of one per stage.
        self.cpu_pending = 0.0
        self._decode_cpu_costs: dict[int, tuple[float, float, float]] = {}

    def _decode_cpu(self, batch_size: int) -> tuple[float, float, float]:
        """A decode step's schedule, launch and process costs at this batch size (the cost
        model's, kept: a stretch asks for each of its segments)."""
        costs = self._decode_cpu_costs.get(batch_size)
        if costs is None:
            cpu = self.cost_model.cpu_time
            costs = self._decode_cpu_costs[batch_size] = (
                cpu("schedule", batch_size, batch_size),
                cpu("launch", batch_size, batch_size),
                cpu("process", batch_size, batch_size),
            )
        return costs

    def _process_cpu(self, plan: ForwardPlan) -> float:
        """The process cost of a launched plan (a decode's is kept by batch size)."""
        if plan.mode is ForwardMode.DECODE:
            return self._decode_cpu(plan.batch_size)[2]
        return self.cost_model.cpu_time("process", plan.batch_size, plan.num_tokens)

    def clock(self) -> float:
        return self.env.now + self.cpu_pending

    def wake(self) -> None:
        """Something for this instance happened now (env.now) that its loop could not know of
        before: an idle wait for the next arrival ends now (a wakeable driver's; else nothing)."""
        ev = self._wake
        if ev is not None and not ev.triggered:
            ev.succeed()

    def run(self, loop: EventLoop) -> None:
        self.start(loop)
        with gc_paused():
            self.env.run()

    def start(self, loop: EventLoop) -> simpy.Process:
        """The loop as a process of the environment, which someone then runs (run(), or a cluster)."""
        if self.fast_forward:
            loop.fast_forward_token = SIM_TOKEN_ID
        return self.env.process(self._drive(loop.run()))

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
                if self.wakeable:
                    yield from self._wait_or_wake(wait.until)
                else:
                    yield timeout(max(wait.until, self.clock()) - env.now)
                    self.cpu_pending = 0.0
            else:
                raise TypeError(f"unknown wait {wait!r}")
        if self.cpu_pending:
            yield timeout(self.cpu_pending)
            self.cpu_pending = 0.0

    def _wait_or_wake(self, until: float) -> Generator[simpy.Event, Any, None]:
        """Wait until `until` (math.inf: no time known) or wake(), whichever comes first. Woken
        before the CPU time charged so far is waited out, the clock keeps that time."""
        env = self.env
        start = self.clock()
        woken = self._wake = env.event()
        yield woken if until == math.inf else env.any_of([woken, env.timeout(max(until, start) - env.now)])
        self._wake = None
        self.cpu_pending = max(start - env.now, 0.0)

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
        so the clock is set to t: less than one ulp later."""
        self.env.land_on(t)

    def _stretch_times(self, ff: FastForward) -> tuple[StretchTimes, float, float] | None:
        """The times of the stretch's steps, as answering each of their waits would stamp them
        (simulator/driver/stretch_clock.py), cut before the first step (after the first) whose schedule
        start reaches ff.next_arrival, and after ff.max_steps steps. None (and nothing changed)
        when fewer than two steps remain. Otherwise the times, and SimPy's time and the CPU time
        pending where the stretch ends (device_free_at is set)."""
        stretch, cost = ff.stretch, self.cost_model
        overlap = ff.inflight is not None
        bulk_price = getattr(cost, "decode_forward_times", None)
        # The cost model reads a decode plan's summaries only: one plan, its summaries set per step
        # (or a segment's steps priced at once, where the cost model can: decode_forward_times).
        plan = ForwardPlan(ForwardMode.DECODE, [], [], [], [], [], [], ids())
        arrival = math.inf if ff.next_arrival is None else ff.next_arrival
        clock = DriverClock(self.env.now, self.cpu_pending, self.device_free_at, ff.inflight.end if overlap else 0.0)
        out = StretchColumns()
        segments, durations = _priced_segments(stretch, bulk_price, arrival - clock.now, ff.max_steps)
        total = segments[-1].stop
        if ff.max_steps is not None and ff.max_steps < total:
            total = ff.max_steps
            if durations is not None:
                durations = durations[:total]
        inflight_process = self._process_cpu(ff.inflight.plan) if overlap else 0.0
        seg_costs = _segment_costs(self._decode_cpu, segments, overlap, inflight_process)
        per_step = None  # the per-step cost arrays of the bulk path, made when first needed
        j, s, cut = 0, 0, False  # the next step, its segment
        while j < total and not cut:
            # In bulk where the cost model priced the steps so and enough come before the next
            # arrival to pay numpy's fixed costs; else (or from where the bulk sums stop) a step at
            # a time to the end of the segment.
            if durations is not None and total - j > BULK_MIN_STEPS and arrival - clock.now > BULK_MIN_STEPS * durations[j]:
                if per_step is None:
                    per_step = _per_step_costs(segments, seg_costs, inflight_process, overlap)
                schedule, launch, process = per_step
                m, cut = vector_steps(
                    clock, durations[j:], schedule[j:total], launch[j:total], process[j:total], overlap, arrival, out, stretch_start=j == 0
                )
                j += m
                if cut or j == total:
                    break
            while segments[s].stop <= j:
                s += 1
            seg = segments[s]
            if durations is not None:
                duration = durations[seg.first_step : seg.stop].tolist().__getitem__
            else:

                def duration(i: int, seg: StretchSegment = seg) -> float:
                    set_decode_step(plan, seg, i)
                    return cost.forward_time(plan)

            cut = scalar_steps(
                clock, seg_costs[s], duration, j - seg.first_step, min(seg.stop, total) - seg.first_step, arrival, out, seg.first_step
            )
            j = len(out)
        m = len(out)
        if m < 2:
            return None
        last = stretch.taken(m)[-1]
        set_decode_step(plan, last, m - 1 - last.first_step)  # the last step's summaries on the plan its handle carries
        self.device_free_at = clock.dfree
        inflight_device = (ff.inflight.start, ff.inflight.end) if overlap else None
        t0s, t1s, t2s, starts, ends, t3s, t4s = out.cols
        times = StretchTimes(m, t0s, t1s, t2s, starts, ends, t3s, t4s, SimForward(plan, starts[-1], ends[-1]), inflight_device)
        return times, clock.now, clock.p


def _priced_segments(
    stretch: DecodeStretch, bulk_price, horizon: float, max_steps: int | None = None
) -> tuple[list[StretchSegment], np.ndarray | None]:
    """The stretch's segments up to the one that reaches `horizon` seconds on (the next arrival
    cuts the steps after it) or step max_steps, with their forward times where the cost model
    prices a segment at once (decode_forward_times); else every segment (up to max_steps), unpriced."""
    if bulk_price is None:
        return stretch.plan(max_steps), None
    segments: list[StretchSegment] = []
    parts, reach = [], 0.0
    for seg in stretch.each_segment():
        segments.append(seg)
        parts.append(bulk_price(seg.batch_size, seg.sum_prefix_len, seg.max_seq_len, seg.stop - seg.first_step))
        reach += len(parts[-1]) * float(parts[-1][0])  # (a segment's forwards only grow longer)
        if reach > horizon or (max_steps is not None and seg.stop >= max_steps):
            break
    return segments, parts[0] if len(parts) == 1 else np.concatenate(parts)


def _segment_costs(
    decode_cpu: Callable[[int], tuple[float, float, float]], segments: list[StretchSegment], overlap: bool, inflight_process: float
) -> list[StepCosts]:
    """Each segment's CPU costs (decode_cpu(batch_size): its schedule, launch and process costs).
    With overlap a step processes the batch launched before it: at a segment's first step, the
    one in flight (its process cost given) or the segment before's."""
    out: list[StepCosts] = []
    before = inflight_process
    for seg in segments:
        schedule, launch, process = decode_cpu(seg.batch_size)
        out.append(StepCosts(schedule, launch, process, overlap, before if overlap else process))
        before = process
    return out


def _per_step_costs(
    segments: list[StretchSegment], seg_costs: list[StepCosts], inflight_process: float, overlap: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each step's schedule, launch and process costs (vector_steps's arrays): its segment's, but
    the process cost of a segment's first step, which with overlap processes the batch before."""
    schedule, launch, process = np.empty((3, segments[-1].stop))
    shift = 1 if overlap else 0  # step j processes the batch launched at j - 1 (at 0: the one in flight)
    for seg, c in zip(segments, seg_costs):
        a, b = seg.first_step, seg.stop
        schedule[a:b] = c.schedule
        launch[a:b] = c.launch
        process[a + shift : b + shift] = c.process  # (the slice stops at the last step)
    if overlap:
        process[0] = inflight_process
    return schedule, launch, process


def set_decode_step(plan: ForwardPlan, seg: StretchSegment, i: int) -> None:
    """The summaries of the segment's step i (from its first) on a decode plan (what a cost model reads)."""
    bs = seg.batch_size
    sum_prefix = seg.sum_prefix_len + i * bs
    if len(plan.req_pool_indices) != bs:
        plan.req_pool_indices = [0] * bs
    plan.num_tokens = bs
    plan.sum_prefix_len = sum_prefix
    plan.sum_seq_len = sum_prefix + bs
    plan.attention_pairs = float(sum_prefix + bs)
    plan.max_seq_len = seg.max_seq_len + i
