"""The decode stretch's clock (simulator/stretch_clock.py): the bulk path gives the very floats
of the step-at-a-time loop, in every regime (device-bound, CPU-bound, switching between them),
with and without overlap, cut at the same arrival, leaving the driver's clock in the same place."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.stretch_clock import DriverClock, StepCosts, StretchColumns, scalar_steps, vector_steps

cost = st.floats(min_value=0.0, max_value=2e-3, allow_nan=False)


def _take(clock: DriverClock, costs: StepCosts, durations: np.ndarray, arrival: float, bulk_from: int | None) -> tuple[StretchColumns, bool]:
    """The stretch's steps one at a time, or (bulk_from) one at a time up to that step, then in bulk."""
    out = StretchColumns()
    listed = durations.tolist()
    k = len(listed)
    stop = k if bulk_from is None else min(k, bulk_from)
    cut = scalar_steps(clock, costs, listed.__getitem__, 0, stop, arrival, out)
    if bulk_from is not None and not cut and len(out) < k:
        _, cut = vector_steps(clock, costs, durations[len(out):], arrival, out)
    if not cut:
        cut = scalar_steps(clock, costs, listed.__getitem__, len(out), k, arrival, out)
    return out, cut


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(min_value=0.0, max_value=5e4, allow_nan=False),
    pending=cost,
    cs=cost, cl=cost, cp=cost, cp0=cost,
    overlap=st.booleans(),
    base=st.floats(min_value=1e-5, max_value=5e-2),
    slope=st.floats(min_value=0.0, max_value=1e-4),
    noise=st.lists(st.floats(min_value=0.0, max_value=3e-3), min_size=1, max_size=200),
    arrival_after=st.one_of(st.none(), st.floats(min_value=0.0, max_value=2.0)),
    bulk_from=st.integers(min_value=1, max_value=60),
)
def test_bulk_steps_equal_steps_one_at_a_time(start, pending, cs, cl, cp, cp0, overlap, base, slope, noise, arrival_after, bulk_from):
    # Durations that grow with the step, with jitter that can make the CPU the bottleneck now and then.
    durations = base + slope * np.arange(len(noise)) + np.asarray(noise) * (np.arange(len(noise)) % 3 == 0)
    arrival = math.inf if arrival_after is None else start + arrival_after
    inflight_end = start + base
    clocks = [DriverClock(start, pending, inflight_end, inflight_end if overlap else 0.0) for _ in range(2)]
    costs = StepCosts(cs, cl, cp, overlap, cp0)  # (the first step may process a larger batch)
    one, cut_one = _take(clocks[0], costs, durations, arrival, None)
    bulk, cut_bulk = _take(clocks[1], costs, durations, arrival, bulk_from)
    assert cut_one == cut_bulk
    assert len(one) >= 1 and len(one) == len(bulk)
    for a, b in zip(one.cols, bulk.cols):
        assert a.tobytes() == b.tobytes()  # the same floats, bit for bit
    assert clocks[0] == clocks[1]


def test_bulk_path_takes_device_bound_steps():
    """Where the device is the bottleneck the bulk path takes every step after the first (it is
    not a path that always falls back)."""
    for overlap in (True, False):
        clock = DriverClock(100.0, 0.0, 100.0, 100.0)
        out = StretchColumns()
        costs = StepCosts(50e-6, 300e-6, 50e-6, overlap, 50e-6)
        scalar_steps(clock, costs, [6e-3].__getitem__, 0, 1, math.inf, out)
        taken, cut = vector_steps(clock, costs, np.full(500, 6e-3), math.inf, out)
        assert (taken, cut) == (500, False) and len(out) == 501
