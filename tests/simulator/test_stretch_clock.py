"""The decode stretch's clock (simulator/driver/stretch_clock.py): the bulk path gives the very floats
of the step-at-a-time loop, in every regime (device-bound, CPU-bound, switching between them),
with and without overlap, across segments of different CPU costs, cut at the same arrival,
leaving the driver's clock in the same place."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.driver.stretch_clock import DriverClock, StepCosts, StretchColumns, scalar_steps, vector_steps

cost = st.floats(min_value=0.0, max_value=2e-3, allow_nan=False)


def _one_at_a_time(clock: DriverClock, segments: list[tuple[StepCosts, list[float]]], arrival: float) -> tuple[StretchColumns, bool]:
    """Every step through scalar_steps, segment by segment (the driver's loop)."""
    out = StretchColumns()
    first = 0
    for costs, durations in segments:
        if scalar_steps(clock, costs, durations.__getitem__, 0, len(durations), arrival, out, first):
            return out, True
        first += len(durations)
    return out, False


def _bulk(clock: DriverClock, segments: list[tuple[StepCosts, list[float]]], arrival: float, bulk_from: int) -> tuple[StretchColumns, bool]:
    """The first bulk_from steps one at a time, then vector_steps over the rest (per-step cost
    arrays, as the driver makes them), then one at a time from where the bulk sums stop."""
    out = StretchColumns()

    def one_at_a_time(stop: int) -> bool:
        for costs, durations, first in _with_firsts(segments):
            j = len(out)
            if j < min(first + len(durations), stop):
                if scalar_steps(clock, costs, durations.__getitem__, j - first, min(len(durations), stop - first), arrival, out, first):
                    return True
        return False

    # Step by step: (its segment's costs, its index in the segment, its duration).
    steps = [(costs, i, d) for costs, durations, _ in _with_firsts(segments) for i, d in enumerate(durations)]
    if one_at_a_time(bulk_from):
        return out, True
    rest = steps[len(out) :]
    if rest:
        # A segment's first step processes the batch before it (first_process), the others their own.
        _, cut = vector_steps(
            clock,
            np.array([d for _, _, d in rest]),
            np.array([c.schedule for c, _, _ in rest]),
            np.array([c.launch for c, _, _ in rest]),
            np.array([c.process if i else c.first_process for c, i, _ in rest]),
            rest[0][0].overlap,
            arrival,
            out,
            stretch_start=not out,
        )
        if cut:
            return out, True
    return out, one_at_a_time(len(steps))


def _with_firsts(segments: list[tuple[StepCosts, list[float]]]):
    """(costs, durations, the segment's first step) of each segment."""
    first = 0
    for costs, durations in segments:
        yield costs, durations, first
        first += len(durations)


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(min_value=0.0, max_value=5e4, allow_nan=False),
    pending=cost,
    stage_costs=st.lists(st.tuples(cost, cost, cost), min_size=1, max_size=4),  # a segment's schedule, launch, process
    cp0=cost,
    overlap=st.booleans(),
    base=st.floats(min_value=1e-5, max_value=5e-2),
    slope=st.floats(min_value=0.0, max_value=1e-4),
    noise=st.lists(st.floats(min_value=0.0, max_value=3e-3), min_size=1, max_size=200),
    cuts=st.lists(st.integers(min_value=1, max_value=199), max_size=3),
    arrival_after=st.one_of(st.none(), st.floats(min_value=0.0, max_value=2.0)),
    bulk_from=st.integers(min_value=0, max_value=60),
)
def test_bulk_steps_equal_steps_one_at_a_time(
    start, pending, stage_costs, cp0, overlap, base, slope, noise, cuts, arrival_after, bulk_from
):
    # Durations that grow with the step, with jitter that can make the CPU the bottleneck now and then.
    durations = (base + slope * np.arange(len(noise)) + np.asarray(noise) * (np.arange(len(noise)) % 3 == 0)).tolist()
    # Segments: runs of steps with their own CPU costs (a batch that lost a request); with overlap
    # a segment's first step processes the batch before (the one in flight, or the segment before's).
    bounds = sorted({c for c in cuts if c < len(durations)} | {0, len(durations)})
    segments, before = [], cp0
    for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
        cs, cl, cp = stage_costs[k % len(stage_costs)]
        segments.append((StepCosts(cs, cl, cp, overlap, before if overlap else cp), durations[a:b]))
        before = cp
    arrival = math.inf if arrival_after is None else start + arrival_after
    inflight_end = start + base
    clocks = [DriverClock(start, pending, inflight_end, inflight_end if overlap else 0.0) for _ in range(2)]
    one, cut_one = _one_at_a_time(clocks[0], segments, arrival)
    bulk, cut_bulk = _bulk(clocks[1], segments, arrival, bulk_from)
    assert cut_one == cut_bulk
    assert len(one) >= 1 and len(one) == len(bulk)
    for a, b in zip(one.cols, bulk.cols):
        assert a.tobytes() == b.tobytes()  # the same floats, bit for bit
    assert clocks[0] == clocks[1]


def test_bulk_path_takes_device_bound_steps():
    """Where the device is the bottleneck the bulk path takes every step, from the stretch's first
    (it is not a path that always falls back)."""
    for overlap in (True, False):
        # (with overlap the batch in flight runs until 100.006; without, the device is idle)
        clock = DriverClock(100.0, 20e-6, 100.006, 100.006) if overlap else DriverClock(100.0, 20e-6, 100.0, 0.0)
        out = StretchColumns()
        n = 500
        taken, cut = vector_steps(
            clock, np.full(n, 6e-3), np.full(n, 50e-6), np.full(n, 300e-6), np.full(n, 50e-6), overlap, math.inf, out, stretch_start=True
        )
        assert (taken, cut) == (500, False) and len(out) == 500
