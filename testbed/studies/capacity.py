"""Capacity search: the highest request rate (the trace's arrivals scaled) that meets every SLO.

A rate multiplier m replays the trace with --time-scale 1/m: m times the trace's own
arrival rate. The search assumes that the SLO metrics do not improve as the rate grows
(monotone). From x1 it doubles (or halves) the rate until one rate passes and the next
fails, within x1/64 .. x64; then it bisects (geometrically) until the failing rate is
within --resolution of the passing one. Every tested rate is a run folder under
DIR/points and a row of DIR/sweep.parquet, and is printed: a non-monotone config shows
there. With grid axes, each config is searched; the searches advance in rounds, one
rate per config per round, so that configs run in parallel.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from testbed.errors import ConfigError
from testbed.interrupts import deferred_interrupts
from testbed.options import ReplayOptions
from testbed.runs.folder import write_json
from testbed.runs.metrics import LATENCIES
from testbed.studies.points import PointResult, SweepPoint
from testbed.studies.runners import Runner
from testbed.studies.sweep import (
    POINTS_DIR,
    SWEEP_FILE,
    TABLE_EVERY_S,
    Every,
    GridAxis,
    Sweep,
    check_out_dir,
    plan_sweep,
    run_points,
    trace_info,
    write_sweep_table,
)

CAPACITY_FILE = "capacity.json"
SCALES_ITSELF = "capacity scales the arrivals itself (rate multiplier m = --time-scale 1/m)"
CLOSED_LOOP_HAS_NO_RATE = (
    "capacity searches the arrival rate of an open loop; a closed loop (N clients) has none to search: "
    "compare concurrencies with testbed sweep --grid concurrency=1,4,16"
)
# Summary keys an SLO can bound: latencies, lower is better.
SLO_KEYS: tuple[str, ...] = tuple(f"{s}_{name}_ms" for name in LATENCIES for s in ("mean", "p50", "p90", "p99"))
MIN_MULTIPLIER = 1 / 64
MAX_MULTIPLIER = 64.0
DEFAULT_RESOLUTION = 0.05
MIN_RESOLUTION = 0.001  # finer would make rates too close to tell apart in folder names


@dataclass(frozen=True)
class Slo:
    key: str  # a latency summary key, e.g. p90_ttft_ms
    limit: float  # met when the value is <= limit

    def violation(self, summary: dict) -> str | None:
        """None if met, else what a person reads: "p90_ttft_ms 612.3 > 500"."""
        value = summary.get(self.key)
        if value is None:
            return f"{self.key} has no value (no request finished)"
        return f"{self.key} {value:.4g} > {self.limit:g}" if value > self.limit else None


def parse_slos(specs: Sequence[str]) -> list[Slo]:
    """--slo KEY=VALUE specs; ConfigError names the bad one (and lists the keys)."""
    slos: list[Slo] = []
    for spec in specs:
        key, sep, text = (part.strip() for part in spec.partition("="))
        if not sep or not key:
            raise ConfigError(f"--slo {spec}: expected KEY=VALUE (e.g. p90_ttft_ms=500)")
        if key not in SLO_KEYS:
            raise ConfigError(f"--slo {spec}: unknown key {key!r}; choose one of {', '.join(SLO_KEYS)}")
        try:
            limit = float(text)
        except ValueError:
            raise ConfigError(f"--slo {spec}: {text!r} is not a number") from None
        if not limit > 0 or math.isinf(limit):
            raise ConfigError(f"--slo {spec}: the limit must be a positive number of ms")
        if any(s.key == key for s in slos):
            raise ConfigError(f"--slo {spec}: {key} is given twice")
        slos.append(Slo(key, limit))
    if not slos:
        raise ConfigError("--slo: give at least one, e.g. --slo p90_ttft_ms=500")
    return slos


@dataclass
class Probe:
    """One tested rate of one config."""

    multiplier: float  # of the trace's arrival rate
    rate: float  # req/s offered
    status: str  # pass | fail | error
    point: str  # its run folder: DIR/points/<point>
    summary: dict | None = None
    violations: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class CapacityResult:
    config: str  # the config's point name (its axis values), "base" without axes
    axes: dict[str, Any]
    status: str  # found | none (fails at the lowest rate) | above_range (passes at the highest) | failed (a run failed)
    trace_rate: float
    multiplier: float | None = None  # the highest passing multiplier
    rate: float | None = None  # ... in req/s
    fail_multiplier: float | None = None  # the lowest failing one above it
    resolution: float | None = None  # fail_multiplier / multiplier - 1
    summary: dict | None = None  # the metrics at the capacity
    point: str | None = None  # the run folder at the capacity
    probes: list[Probe] = field(default_factory=list)  # in the order tested
    error: str | None = None

    @property
    def sims(self) -> int:
        return len(self.probes)

    def message(self) -> str:
        """One line a person reads."""
        if self.status == "found":
            # Served below offered: the trace is too short for the load to build up (or the system saturates).
            served = f", served {self.summary['request_throughput']:.4g}" if self.summary else ""
            return (
                f"capacity {self.rate:.4g} req/s offered{served} (x{self.multiplier:.4g} the trace's rate), "
                f"resolution {self.resolution * 100:.1f}% (x{self.fail_multiplier:.4g} fails), {self.sims} sims"
            )
        if self.status == "above_range":
            return (
                f"meets the SLOs even at {self.rate:.4g} req/s (x{self.multiplier:.4g}, the highest rate tried): "
                f"capacity is at least that, {self.sims} sims"
            )
        if self.status == "none":
            lowest = self.probes[-1]
            return (
                f"meets no SLO even at {lowest.rate:.4g} req/s (x{lowest.multiplier:.4g}, the lowest rate tried): "
                f"{'; '.join(lowest.violations)}, {self.sims} sims"
            )
        return f"failed at x{self.probes[-1].multiplier:.4g}: {self.error}"

    def to_json(self) -> dict:
        return asdict(self) | {"sims": self.sims, "message": self.message()}


class CapacitySearch:
    """The bracket-then-bisect search of one config, as a state machine: next_point() is the
    next rate to test (None when done), record() takes its result."""

    def __init__(self, config: SweepPoint, slos: Sequence[Slo], resolution: float, trace_rate: float, out_dir: Path):
        self.config = config
        self.slos = list(slos)
        self.resolution = resolution
        self.trace_rate = trace_rate
        self.out_dir = out_dir
        self.probes: list[Probe] = []
        self.lo: float | None = None  # highest passing multiplier
        self.hi: float | None = None  # lowest failing multiplier
        self.error: str | None = None
        self._multiplier: dict[str, float] = {}  # point name -> multiplier

    def next_multiplier(self) -> float | None:
        if self.error is not None:
            return None
        if not self.probes:
            return 1.0
        if self.lo is None:  # every rate so far fails: halve
            m = self.hi / 2
            return m if m >= MIN_MULTIPLIER else None
        if self.hi is None:  # every rate so far passes: double
            m = self.lo * 2
            return m if m <= MAX_MULTIPLIER else None
        if self.hi / self.lo - 1 <= self.resolution:
            return None
        return math.sqrt(self.lo * self.hi)  # bisect the ratio: the resolution is relative

    def point_at(self, m: float) -> SweepPoint:
        c = self.config
        name = f"{c.name},rate=x{m:.6g}" if c.axes else f"rate=x{m:.6g}"
        time_scale = 1 / m
        self._multiplier[name] = m
        return SweepPoint(
            name,
            c.axes + (("time_scale", time_scale),),
            replace(c.options, time_scale=time_scale),
            self.out_dir / POINTS_DIR / name,
        )

    def next_point(self) -> SweepPoint | None:
        m = self.next_multiplier()
        return None if m is None else self.point_at(m)

    def record(self, point: SweepPoint, result: PointResult) -> None:
        m = self._multiplier[point.name]
        probe = Probe(m, m * self.trace_rate, "error", point.name, result.summary)
        if result.status != "complete" or result.summary is None:
            probe.error = self.error = result.error or f"run {result.status}"
        else:
            probe.violations = [v for s in self.slos if (v := s.violation(result.summary)) is not None]
            probe.status = "fail" if probe.violations else "pass"
            if probe.violations:
                self.hi = m if self.hi is None else min(self.hi, m)
            else:
                self.lo = m if self.lo is None else max(self.lo, m)
        self.probes.append(probe)

    def result(self) -> CapacityResult:
        r = CapacityResult(self.config.name, dict(self.config.axes), "failed", self.trace_rate, probes=self.probes, error=self.error)
        if self.error is not None:
            return r
        if self.lo is None:
            r.status = "none"
            return r
        best = next(p for p in self.probes if p.multiplier == self.lo)
        r.status = "found" if self.hi is not None else "above_range"
        r.multiplier, r.rate, r.summary, r.point = self.lo, best.rate, best.summary, best.point
        if self.hi is not None:
            r.fail_multiplier = self.hi
            r.resolution = self.hi / self.lo - 1
        return r


@dataclass
class CapacityReport:
    trace: str
    trace_requests: int  # with the first config's options (each result has its own trace_rate)
    trace_rate: float  # req/s at x1
    slos: list[Slo]
    resolution: float  # asked for
    results: list[CapacityResult]  # ranked: highest capacity first
    out_dir: Path
    skipped: dict[str, str] = field(default_factory=dict)  # configs whose options cannot run together -> why

    def fewest_replicas(self) -> list[FewestReplicas]:
        """With a replicas axis: for each setting of the other axes, the fewest replicas whose
        capacity reaches the trace's own rate (x1). Capacity is assumed monotone in the rate, so a
        config that passes above x1 passes at x1."""
        if not self.results or "replicas" not in self.results[0].axes:
            return []
        groups: dict[tuple, list[CapacityResult]] = {}
        for r in self.results:
            others = tuple((k, v) for k, v in r.axes.items() if k != "replicas")
            groups.setdefault(others, []).append(r)
        fewest = []
        for others, results in groups.items():
            holding = [int(r.axes["replicas"]) for r in results if r.multiplier is not None and r.multiplier >= 1.0]
            fewest.append(FewestReplicas(dict(others), min(holding) if holding else None, max(int(r.axes["replicas"]) for r in results)))
        return fewest

    def to_json(self) -> dict:
        return {
            "trace": self.trace,
            "trace_requests": self.trace_requests,
            "trace_rate": self.trace_rate,
            "slos": {s.key: s.limit for s in self.slos},
            "resolution": self.resolution,
            "out": str(self.out_dir),
            "configs": [r.to_json() for r in self.results],
            **({"fewest_replicas": [asdict(f) for f in fewest]} if (fewest := self.fewest_replicas()) else {}),
            **({"skipped": self.skipped} if self.skipped else {}),
        }


@dataclass
class FewestReplicas:
    """The fewest replicas that hold the SLOs at the trace's own rate, for one setting of the other axes."""

    axes: dict[str, Any]  # the other axes' values
    replicas: int | None  # None: not even the most replicas tried hold
    most_tried: int

    def message(self) -> str:
        where = ", ".join(f"{k}={v}" for k, v in self.axes.items())
        found = (
            f"{self.replicas} replicas"
            if self.replicas is not None
            else f"more than {self.most_tried} replicas (the most tried do not hold)"
        )
        return f"fewest replicas that meet the SLOs at the trace's rate (x1){' with ' + where if where else ''}: {found}"


def rank(results: Sequence[CapacityResult]) -> list[CapacityResult]:
    """Highest capacity first (a lower bound above the range counts as its value); configs that
    meet the SLOs at no rate, then failed ones, last."""
    order = {"above_range": 0, "found": 0, "none": 1, "failed": 2}
    return sorted(results, key=lambda r: (order[r.status], -(r.rate or 0.0)))


def plan_capacity(
    trace_path: str,
    base: ReplayOptions,
    axes: Sequence[GridAxis],
    out_dir: str | Path,
    resolution: float = DEFAULT_RESOLUTION,
    gpus: int | None = None,
) -> Sweep:
    """The configs to search (a sweep's points without time_scale), checked before any work."""
    if not MIN_RESOLUTION <= resolution < 1:
        raise ConfigError(f"--resolution {resolution}: choose a relative resolution in [{MIN_RESOLUTION}, 1), e.g. 0.05")
    if base.time_scale != 1.0:
        raise ConfigError(f"--time-scale {base.time_scale:g}: {SCALES_ITSELF}; leave it out")
    if any(a.name == "time_scale" for a in axes):
        raise ConfigError(f"--grid time_scale: {SCALES_ITSELF}")
    if base.concurrency is not None:
        raise ConfigError(f"--concurrency {base.concurrency}: {CLOSED_LOOP_HAS_NO_RATE}")
    if any(a.name == "concurrency" for a in axes):
        raise ConfigError(f"--grid concurrency: {CLOSED_LOOP_HAS_NO_RATE}")
    sweep = plan_sweep(trace_path, base, axes, out_dir, gpus)
    if not math.isfinite(sweep.trace_info.rate):
        raise ConfigError(f"{trace_path}: all requests arrive at once, so scaling the arrivals changes nothing")
    return sweep


def _arrival_rates(sweep: Sweep) -> list[float]:
    """Each config's x1 rate: axes such as max_requests or seed (generated arrivals) change it."""
    by_view: dict[tuple, float] = {}
    rates = []
    for c in sweep.points:
        o = c.options
        view = (o.format, o.rate, o.seed, o.max_requests)
        if view not in by_view:
            by_view[view] = trace_info(sweep.trace, o).rate if by_view else sweep.trace_info.rate
            if not math.isfinite(by_view[view]):
                raise ConfigError(f"{c.name}: all requests arrive at once, so scaling the arrivals changes nothing")
        rates.append(by_view[view])
    return rates


def run_capacity(
    sweep: Sweep,
    slos: Sequence[Slo],
    runner: Runner,
    resolution: float = DEFAULT_RESOLUTION,
    resume: bool = False,
    on_probe: Callable[[CapacityResult, Probe], None] | None = None,
) -> CapacityReport:
    """Search the capacity of every config of plan_capacity; writes the tested runs,
    sweep.parquet and capacity.json."""
    check_out_dir(sweep.out_dir, resume)
    searches = [CapacitySearch(c, slos, resolution, rate, sweep.out_dir) for c, rate in zip(sweep.points, _arrival_rates(sweep))]
    # (round, config, point, result): the table lists them in this order, not in the order
    # parallel points happened to finish, so that the same search writes the same table.
    tested: list[tuple[int, int, SweepPoint, PointResult]] = []
    every = Every(TABLE_EVERY_S)

    def write_table() -> None:
        if tested:
            ordered = sorted(tested, key=lambda t: t[:2])
            with deferred_interrupts():
                write_sweep_table(sweep.out_dir / SWEEP_FILE, sweep, [t[2] for t in ordered], [t[3] for t in ordered])

    try:
        for round_no in itertools.count():
            # One round: the next rate of every search not done, in parallel.
            batch = {p.name: (i, s, p) for i, s in enumerate(searches) if (p := s.next_point()) is not None}
            if not batch:
                break

            def record(point: SweepPoint, result: PointResult, batch=batch, round_no=round_no) -> None:
                config, search, _ = batch[point.name]
                search.record(point, result)
                tested.append((round_no, config, point, result))
                if on_probe is not None:
                    on_probe(search.result(), search.probes[-1])
                if every.due():
                    write_table()

            run_points(sweep, [p for _, _, p in batch.values()], runner, resume, record)
    finally:
        write_table()
    report = CapacityReport(
        sweep.trace,
        sweep.trace_info.requests,
        sweep.trace_info.rate,
        list(slos),
        resolution,
        rank([s.result() for s in searches]),
        sweep.out_dir,
        dict(sweep.skipped),
    )
    sweep.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(sweep.out_dir / CAPACITY_FILE, report.to_json())
    return report
