"""Sweeps: the cross product of replay options, one run folder per point, and sweep.parquet.

    DIR/points/<name>/   one run folder per point: exactly what `testbed replay TRACE
                         <options> --out DIR/points/<name>` writes. The name is the
                         point's axis values (policy=lpm,overlap=off,...), so a
                         re-run recognizes finished points (--resume).
    DIR/sweep.parquet    one row per point: point, status, error, every replay option
                         (the axes first), every summary metric, wall_s, run_dir. The
                         schema metadata under "testbed.sweep" names the axes, the
                         option columns and the metric columns (see load_sweep).

Points run on local processes or on a Ray cluster (testbed.studies.runners); both call
testbed.studies.points.run_point, so both give the same run folders and the same table.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from testbed.errors import ConfigError
from testbed.interrupts import deferred_interrupts
from testbed.options import (
    OPTION_FIELDS,
    ReplayOptions,
    check_options,
    parse_option_value,
    recorded_options,
    resolved_options,
)
from testbed.replay import load_replay_trace
from testbed.studies.points import OnResult, PointResult, SweepPoint, finished_result, folder_result
from testbed.studies.runners import Runner

SWEEP_FILE = "sweep.parquet"
POINTS_DIR = "points"
META_KEY = b"testbed.sweep"  # parquet schema metadata: what the columns are
TABLE_VERSION = 1


# --- grid ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GridAxis:
    name: str  # the ReplayOptions field (the --flag with underscores)
    values: tuple[Any, ...]  # parsed, in the order given


def parse_grid(specs: Sequence[str], forbidden: Mapping[str, str] | None = None) -> list[GridAxis]:
    """--grid AXIS=V1,V2,... specs -> axes. AXIS is a replay option, spelled as its flag
    (chunked-prefill-size) or its field (chunked_prefill_size); `forbidden` maps the options
    that cannot be axes to why. ConfigError names the bad one."""
    axes: list[GridAxis] = []
    for spec in specs:
        axis_text, sep, values_text = spec.partition("=")
        axis_text = axis_text.strip().removeprefix("--")
        if not sep or not axis_text:
            raise ConfigError(f"--grid {spec}: expected AXIS=V1,V2,... (e.g. policy=fcfs,lpm)")
        name = axis_text.replace("-", "_")
        if name not in OPTION_FIELDS:
            raise ConfigError(f"--grid {spec}: unknown axis {axis_text!r}; an axis is a replay option: {', '.join(OPTION_FIELDS)}")
        if forbidden and name in forbidden:
            raise ConfigError(f"--grid {spec}: {axis_text} cannot be an axis: {forbidden[name]}")
        if any(a.name == name for a in axes):
            raise ConfigError(f"--grid {spec}: axis {axis_text!r} is given twice")
        values = []
        for text in values_text.split(","):
            if not text.strip():
                raise ConfigError(f"--grid {spec}: empty value for {axis_text}")
            try:
                value = parse_option_value(name, text.strip())
            except ValueError as e:
                raise ConfigError(f"--grid {axis_text}={text.strip()}: {e}") from None
            if value in values:
                raise ConfigError(f"--grid {spec}: value {text.strip()!r} of {axis_text} is listed twice")
            values.append(value)
        axes.append(GridAxis(name, tuple(values)))
    return axes


def format_value(value: Any) -> str:
    """A value as it appears in a point's name: on/off, none, 0.5, lpm."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    return str(value)


_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+-]")


def point_name(axes: Sequence[tuple[str, Any]]) -> str:
    """The folder name of a point: its axis values, e.g. policy=lpm,overlap=off ("base" if none).
    A value that is not safe in a file name (a model path) is replaced, with a hash to stay unique."""
    if not axes:
        return "base"
    name = ",".join(f"{k}={format_value(v)}" for k, v in axes)
    safe = _UNSAFE.sub("_", name)
    if safe != name or len(safe) > 150:
        digest = hashlib.sha1(repr(tuple(axes)).encode()).hexdigest()[:8]
        safe = f"{safe[:140]}-{digest}"
    return safe


def check_named_values(axes: Sequence[GridAxis]) -> None:
    """An axis of models, hardware or profiles names things that must load: each value is loaded once
    here, so that a bad one is refused (exit 2) before any point runs, not found by a failed point."""
    from scheduler.model_config import load_model_config
    from simulator.costs.sources import load_profile
    from simulator.hardware.specs import load_hardware
    from testbed.errors import USER_ERRORS

    loaders = {"model": load_model_config, "hardware": load_hardware, "profile": load_profile}
    for axis in axes:
        load = loaders.get(axis.name)
        for value in axis.values if load else ():
            if value is None:
                continue
            try:
                load(value)
            except (*USER_ERRORS, OSError, ValueError) as e:
                raise ConfigError(f"--grid {axis.name}={value}: {e}") from None


def gpus_used(opts: ReplayOptions) -> int:
    """The GPUs a configuration runs on: its instances (replicas, or prefill + decode ones), each
    over tp x dp GPUs."""
    instances = opts.prefill_replicas + opts.decode_replicas if opts.disaggregated else opts.replicas
    return instances * opts.tp * opts.dp


def expand(
    base: ReplayOptions, axes: Sequence[GridAxis], out_dir: Path, gpus: int | None = None
) -> tuple[list[SweepPoint], dict[str, str]]:
    """The cross product of the axes over the base options, in grid order (last axis fastest),
    and the points whose options cannot run together (name -> why), which are skipped: lpm
    with --scheduler vllm, in a grid of both policies and both schedulers; with a GPU budget
    (`gpus`), the points that use another number of GPUs (the splits of a budget into prefill
    and decode instances, from a grid of both). A value no point can run with (every combination
    of it refused) is a mistake in the grid: ConfigError."""
    check_named_values(axes)
    points: list[SweepPoint] = []
    skipped: dict[str, str] = {}
    for combo in itertools.product(*(a.values for a in axes)):
        values = tuple(zip((a.name for a in axes), combo))
        opts = replace(base, **dict(values))
        name = point_name(values)
        try:
            check_options(opts)  # every point can start, before any of them does
            if gpus is not None and gpus_used(opts) != gpus:
                raise ConfigError(f"it uses {gpus_used(opts)} GPUs, not the --gpus budget of {gpus}")
        except ConfigError as e:
            skipped[name] = str(e)
        points.append(SweepPoint(name, values, opts, Path(out_dir) / POINTS_DIR / name))
    _check_some_point_runs(points, skipped, axes)
    return points, skipped


def _check_some_point_runs(points: Sequence[SweepPoint], skipped: Mapping[str, str], axes: Sequence[GridAxis]) -> None:
    """Refuse a grid where nothing runs, or where a value of an axis runs with nothing: the
    option itself is wrong (a typo, a bound), not its combination with the others."""
    first_error = next((skipped[p.name] for p in points if p.name in skipped), None)
    if first_error is None:
        return
    if len(skipped) == len(points):
        raise ConfigError(first_error if len(points) == 1 else f"no point of the grid can run: {first_error}")
    for axis in axes:
        for value in axis.values:
            with_value = [p for p in points if dict(p.axes)[axis.name] == value]
            if all(p.name in skipped for p in with_value):
                raise ConfigError(f"--grid {axis.name}={format_value(value)}: no point with it can run: {skipped[with_value[0].name]}")


# --- a sweep --------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceInfo:
    sha256: str  # of the file, as run.json records it
    requests: int  # after --max-requests
    rate: float  # arrival rate, req/s: (requests - 1) / (last arrival - first arrival); inf if all at once


def trace_info(trace_path: str, opts: ReplayOptions) -> TraceInfo:
    """The trace as a replay with these options sees it (format, generated arrivals, --max-requests)."""
    trace = load_replay_trace(trace_path, opts)
    requests = trace.requests[: opts.max_requests] if opts.max_requests is not None else trace.requests
    span = requests[-1].arrival_s - requests[0].arrival_s
    return TraceInfo(trace.sha256(), len(requests), (len(requests) - 1) / span if span > 0 else float("inf"))


@dataclass
class Sweep:
    trace: str  # as given; recorded in every point's run.json
    trace_info: TraceInfo  # with the first point's options
    axes: list[GridAxis]
    grid: list[SweepPoint]  # every point of the cross product, in grid order
    out_dir: Path
    skipped: dict[str, str] = field(default_factory=dict)  # points whose options cannot run together -> why

    @property
    def points(self) -> list[SweepPoint]:
        """The points that run."""
        return [p for p in self.grid if p.name not in self.skipped]

    def skipped_result(self, point: SweepPoint) -> PointResult:
        return PointResult(point.name, "skipped", None, self.skipped[point.name])


def plan_sweep(trace_path: str, base: ReplayOptions, axes: Sequence[GridAxis], out_dir: str | Path, gpus: int | None = None) -> Sweep:
    """The points of a sweep, checked: every option combination can start (and uses `gpus` GPUs,
    where a budget is given), and the trace loads (a bad trace is one error, not one failed point
    per point)."""
    out_dir = Path(out_dir).absolute()
    grid, skipped = expand(base, axes, out_dir, gpus)
    runs = next(p for p in grid if p.name not in skipped)
    return Sweep(str(trace_path), trace_info(trace_path, runs.options), list(axes), grid, out_dir, skipped)


def check_out_dir(out_dir: Path, resume: bool) -> None:
    """Refuse to run over an earlier sweep unless --resume says to keep its finished points."""
    points_dir = out_dir / POINTS_DIR
    if not resume and points_dir.is_dir() and any(points_dir.iterdir()):
        raise ConfigError(f"{out_dir} already holds a sweep: --resume to skip its finished points, or another --out")


def run_points(sweep: Sweep, points: Sequence[SweepPoint], runner: Runner, resume: bool, on_result: OnResult) -> None:
    """Run the points not finished already (with resume); on_result sees every result, the
    resumed ones first."""
    todo = []
    for p in points:
        done = finished_result(p, sweep.trace_info.sha256) if resume else None
        if done is not None:
            on_result(p, done)
        else:
            todo.append(p)
    runner.run(sweep.trace, todo, on_result)


class Every:
    """due() is True the first time and then at most once per interval: a table rewritten as
    results come, without rewriting it for every one of thousands of points."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.seconds
        return True


TABLE_EVERY_S = 1.0  # sweep.parquet is rewritten at most this often while points finish


def run_sweep(
    sweep: Sweep,
    runner: Runner,
    resume: bool = False,
    on_result: OnResult | None = None,
) -> list[PointResult]:
    """Run every point (skipping finished ones with resume) and write sweep.parquet as points
    finish and at the end, also when interrupted: then no new point starts, the running ones
    stop ("incomplete"), and the ones not started are rows with status "pending".
    A sweep killed outright leaves its finished points' folders and the table as last written;
    --resume goes on from them."""
    check_out_dir(sweep.out_dir, resume)
    results: dict[str, PointResult] = {}
    every = Every(TABLE_EVERY_S)

    def write_table(final: bool = False) -> None:
        ordered = grid_results(sweep, results)
        if final:  # stopped: a point killed while it ran has a folder but no result reached us
            ordered = [folder_result(p, sweep.trace_info.sha256) or r if r.status == "pending" else r for p, r in zip(sweep.grid, ordered)]
        with deferred_interrupts():  # never half a table
            write_sweep_table(sweep.out_dir / SWEEP_FILE, sweep, sweep.grid, ordered)

    def record(point: SweepPoint, result: PointResult) -> None:
        results[point.name] = result
        if on_result is not None:
            on_result(point, result)
        if every.due():
            write_table()

    try:
        run_points(sweep, sweep.points, runner, resume, record)
    finally:
        write_table(final=True)
    return grid_results(sweep, results)


def grid_results(sweep: Sweep, results: Mapping[str, PointResult]) -> list[PointResult]:
    """One result per point of the grid, in grid order: skipped, as reported, or pending."""
    return [
        sweep.skipped_result(p) if p.name in sweep.skipped else results.get(p.name) or PointResult(p.name, "pending") for p in sweep.grid
    ]


# --- sweep.parquet --------------------------------------------------------------------------


def metric_column(key: str) -> str:
    """The column of a summary key; `summary_` prefixed where it would clash with an option
    (kv_tokens: the option may be none, the summary holds the pool size used)."""
    return f"summary_{key}" if key in OPTION_FIELDS else key


def sweep_rows(sweep: Sweep, points: Sequence[SweepPoint], results: Sequence[PointResult]) -> tuple[list[dict], dict]:
    """Rows of sweep.parquet and its metadata (what each column is)."""
    axis_names = [a.name for a in sweep.axes]
    extra_axes = [k for p in points for k, _ in p.axes if k not in axis_names]  # capacity's time_scale
    axis_names += list(dict.fromkeys(extra_axes))
    recorded = [recorded_options(resolved_options(p.options)) for p in points]
    # (a PD run's own options only where a point is one, as run.json records them)
    option_columns = axis_names + [f for f in OPTION_FIELDS if f not in axis_names and any(f in r for r in recorded)]
    metric_keys: dict[str, None] = {}
    for r in results:
        metric_keys.update(dict.fromkeys(r.summary or {}))
    rows = []
    for p, r, opts in zip(points, results, recorded):
        row: dict[str, Any] = {"point": p.name, "status": r.status, "error": r.error}
        row.update({f: opts.get(f) for f in option_columns})
        summary = r.summary or {}
        row.update({metric_column(k): summary.get(k) for k in metric_keys})
        row["wall_s"] = r.wall_s
        row["run_dir"] = str(p.run_dir.relative_to(sweep.out_dir)) if p.run_dir.is_relative_to(sweep.out_dir) else str(p.run_dir)
        rows.append(row)
    meta = {
        "version": TABLE_VERSION,
        "trace": {"path": sweep.trace, "sha256": sweep.trace_info.sha256},
        "axes": [{"name": a.name, "values": list(a.values)} for a in sweep.axes],
        "axis_columns": axis_names,  # the options that vary across points
        "option_columns": option_columns,  # every replay option, resolved as in run.json
        "metric_columns": {metric_column(k): k for k in metric_keys},  # column -> run.json summary key
        "point_columns": ["point", "status", "error", "wall_s", "run_dir"],
    }
    return rows, meta


def write_sweep_table(path: Path, sweep: Sweep, points: Sequence[SweepPoint], results: Sequence[PointResult]) -> None:
    rows, meta = sweep_rows(sweep, points, results)
    table = pa.Table.from_pylist(rows)  # keeps ints with nones as ints (pandas would make floats)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), META_KEY: json.dumps(meta).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def load_sweep(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """sweep.parquet (or the folder holding it) -> (one row per point, what the columns are)."""
    path = Path(path)
    if path.is_dir():
        path = path / SWEEP_FILE
    if not path.is_file():
        folder = path.parent
        held = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()) if folder.is_dir() else []
        points = folder / POINTS_DIR
        runs = sorted(p.name for p in points.iterdir() if (p / "run.json").is_file()) if points.is_dir() else []
        said = f"it holds {', '.join(held[:8])}" + (", ..." if len(held) > 8 else "") if held else "it is empty or missing"
        if runs:
            said += f"; {len(runs)} point folder(s) with a run.json (a sweep stopped before its table was written)"
        raise FileNotFoundError(f"{folder}: no {SWEEP_FILE}: {said}")
    table = pq.read_table(path)
    meta = json.loads((table.schema.metadata or {}).get(META_KEY, b"{}"))
    return table.to_pandas(), meta
