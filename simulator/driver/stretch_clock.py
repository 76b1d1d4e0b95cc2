"""The clock of a decode stretch: each step's times, as the SimDriver stamps them one by one.

Answering a step's waits (sim_driver.py: CpuWork "schedule", Launch, AwaitResult, CpuWork
"process") runs these float operations, with p the CPU time charged and not yet waited out:

    t0 = now + p                                  schedule starts (the stretch is cut here
                                                  if t0 reaches the next arrival)
    p += cs; t1 = now + p                         launch starts
    p += cl; start = max(t1, dfree)               the forward starts when launched and the
    end = max(start + d, now + p); dfree = end    stream is free; it ends no earlier than
    t2 = now + p                                  its launch
    now = now + (max(waited, now + p) - now)      the await: SimPy's timeout to `waited`
    p = 0.0; t3 = now + p                         (this step's end; with overlap, the end of
    p += cp; t4 = now + p                         the step launched before)

scalar_steps runs exactly that, a step at a time. From the second step on p starts at the
process cost charged at the step before (0.0 + cp is cp), so when every max picks the same side at
every step (the device is the bottleneck, the usual case) the steps are sums along one sequence:
np.add.accumulate, which adds in order, gives the very floats of the loop, and the per-step costs
(a stretch's segments differ in batch size, so in CPU costs) are elementwise sums of the same
floats. vector_steps computes that, then checks elementwise that every max did pick that side
and that each await landed exactly on its target; the first step that fails the check, and
every step after it, go back to the scalar loop. So both paths give the same floats; the
vector path is only faster.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(slots=True)
class DriverClock:
    """The driver's state between two steps."""

    now: float  # SimPy's time
    p: float  # CPU time charged, not yet waited out
    dfree: float  # when the device stream is free (the end of the last forward launched)
    prev_end: float  # overlap: the end of the forward in flight (awaited by the next step)


@dataclass(slots=True)
class StepCosts:
    """CPU seconds of a decode step's stages (the same every step of a segment)."""

    schedule: float
    launch: float
    process: float
    overlap: bool  # the await waits for the step launched before, not this one
    first_process: float  # the first step's: with overlap it processes the batch in flight, which may be larger


class StretchColumns:
    """The seven times of each of the stretch's steps, in StretchTimes's order (t0, t1, t2,
    start, end, t3, t4 above), appended step by step or in bulk."""

    def __init__(self) -> None:
        self.cols = [array("d") for _ in range(7)]

    def __len__(self) -> int:
        return len(self.cols[0])

    def extend(self, values: tuple[np.ndarray, ...]) -> None:
        """Float64 numpy arrays (tobytes copies strided ones in order)."""
        for col, v in zip(self.cols, values):
            col.frombytes(v.tobytes())


def scalar_steps(
    clock: DriverClock,
    costs: StepCosts,
    duration: Callable[[int], float],
    j: int,
    stop: int,
    arrival: float,
    out: StretchColumns,
    first_step: int = 0,
) -> bool:
    """Steps j .. stop - 1 of a stretch's part that starts at its step first_step (costs and
    durations, from duration(0), are that part's), one at a time (the module's loop). Returns
    True if the stretch was cut before a step (after its first) whose schedule would start at
    or after arrival."""
    now, p, dfree, prev_end = clock.now, clock.p, clock.dfree, clock.prev_end
    cs, cl, overlap = costs.schedule, costs.launch, costs.overlap
    add_t0, add_t1, add_t2, add_start, add_end, add_t3, add_t4 = (c.append for c in out.cols)
    cut = False
    while j < stop:
        t0 = now + p
        if j + first_step and t0 >= arrival:
            cut = True
            break
        p += cs
        t1 = now + p
        p += cl
        start = t1 if t1 >= dfree else dfree
        end = start + duration(j)
        if end < now + p:
            end = now + p
        dfree = end
        t2 = now + p
        waited = prev_end if overlap else end
        now_p = now + p
        now = now + ((waited if waited >= now_p else now_p) - now)
        p = 0.0
        t3 = now + p
        p += costs.process if j else costs.first_process
        t4 = now + p
        prev_end = end
        add_t0(t0)
        add_t1(t1)
        add_t2(t2)
        add_start(start)
        add_end(end)
        add_t3(t3)
        add_t4(t4)
        j += 1
    clock.now, clock.p, clock.dfree, clock.prev_end = now, p, dfree, prev_end
    return cut


def vector_steps(
    clock: DriverClock,
    durations: np.ndarray,
    schedule: np.ndarray,
    launch: np.ndarray,
    process: np.ndarray,
    overlap: bool,
    arrival: float,
    out: StretchColumns,
    stretch_start: bool = False,
) -> tuple[int, bool]:
    """Steps in bulk while the device is the bottleneck: step j's forward takes durations[j], its
    CPU stages schedule[j] and launch[j], and its processing (with overlap, of the batch launched
    before it) process[j]; the first one starts with the clock's pending CPU time. Returns (steps
    taken, cut): the steps before the first cut or the first step the bulk sums cannot take; the
    clock moves past them. stretch_start: the first is the stretch's first step, which an arrival
    does not cut (scalar_steps's rule).
    Durations are not negative (a forward's), and float sums are monotone: so a forward that
    starts no earlier than its launch ends (t2) also starts after its schedule (t1) and ends
    after its launch."""
    n = len(durations)
    if n == 0:
        return 0, False
    pending = np.empty(n)  # p at each step's start: the process cost charged at the step before
    pending[0] = clock.p
    pending[1:] = process[:-1]
    p1 = pending + schedule  # p after "schedule"
    p2 = p1 + launch  # after "launch"
    if overlap:
        # The forward starts when the one before ends (dfree) and the await waits for that one:
        # end_j = end_{j-1} + d_j, and now_{j+1} = end_{j-1}.
        seq = np.empty(n + 1)
        seq[0] = clock.dfree
        seq[1:] = durations
        # One buffer, [now, dfree + ...]: nows (now, then each step's end before it) and ends_
        # (ends_[i]: end of step i - 1; ends_[0] the one before) are views of it.
        buf = np.empty(n + 2)
        buf[0] = clock.now
        ends_ = np.add.accumulate(seq, out=buf[1:])
        nows = buf[: n + 1]
        before, start, end = nows[:n], ends_[:n], ends_[1:]
        t1, t2 = before + p1, before + p2
        waited = start  # the end of the step before
        # start >= t1, end >= t2, waited >= t2 and the await lands exactly on waited:
        ok = start >= t2
        ok &= before + (waited - before) == waited
        if clock.prev_end != clock.dfree:  # (after a step it is; the sums assume it)
            ok[0] = False
    else:
        # The step launches when its schedule ends and the await waits for it:
        # end_j = (now_j + p1_j) + d_j, and now_{j+1} = end_j.
        seq = np.empty(2 * n + 1)
        seq[0] = clock.now
        seq[1::2] = p1
        seq[2::2] = durations
        acc = np.add.accumulate(seq)
        nows = acc[0::2]  # nows[i]: now at the start of step i (then after the last)
        before, t1, end = nows[:n], acc[1::2], acc[2::2]
        start = t1
        t2 = before + p2
        prev = np.empty(n)
        prev[0] = clock.dfree
        prev[1:] = end[:-1]
        waited = end
        ok = t1 >= prev
        ok &= end >= t2
        ok &= before + (waited - before) == waited
    t0 = before + pending
    hits = t0 >= arrival
    if stretch_start:
        hits[0] = False
    cut_at = int(hits.argmax())
    if not hits[cut_at]:
        cut_at = n
    bad = int(ok.argmin())
    bad_at = n if ok[bad] else bad
    m = min(cut_at, bad_at)
    if m:
        after = nows[1 : m + 1]
        out.extend((t0[:m], t1[:m], t2[:m], start[:m], end[:m], after, after + process[:m]))
        clock.now, clock.p = float(after[-1]), float(process[m - 1])
        clock.dfree = clock.prev_end = float(end[m - 1])
    return m, cut_at <= bad_at and cut_at < n
