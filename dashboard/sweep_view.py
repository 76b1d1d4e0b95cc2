"""A sweep on the What-if page: finding sweeps, their points table, a metric over two axes,
and the Pareto front of throughput against latency.

Pure of Streamlit. It reads what `testbed sweep` and `testbed capacity` write:
DIR/sweep.parquet, whose schema metadata names the axes and the metric columns
(testbed.studies.sweep.load_sweep), and DIR/points/<name>/, one run folder per point.
Only complete points have numbers to draw; failed, pending and incomplete ones
stay in the table with their error.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import quote

import numpy as np
import pandas as pd

from testbed.runs.folder import RUN_FILE
from testbed.studies.capacity import CAPACITY_FILE
from testbed.studies.sweep import POINTS_DIR, SWEEP_FILE, format_value, load_sweep

MAX_DEPTH = 3  # runs/<sweep>, runs/<group>/<sweep>, ...: deep enough for people's layouts, cheap to walk
COMPLETE = "complete"
MEAN = "mean of all"  # an "other axis" averaged over its values instead of held at one
# The headline numbers of the points table, in this order (those the sweep has).
HEADLINE_METRICS = (
    "completed",
    "p50_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "p90_tpot_ms",
    "p90_e2e_ms",
    "request_throughput",
    "output_throughput",
    "cache_hit_rate",
    "wall_s",
)
DEFAULT_METRIC = "p90_ttft_ms"
DEFAULT_THROUGHPUT = "output_throughput"
DEFAULT_LATENCY = "p90_ttft_ms"


class SweepLoadError(Exception):
    """A sweep folder that cannot be shown, and why (one line for the page)."""


@dataclass(frozen=True)
class Sweep:
    path: Path  # the folder holding sweep.parquet
    points: pd.DataFrame  # sweep.parquet, one row per point
    meta: dict  # its "testbed.sweep" schema metadata

    @property
    def axes(self) -> list[str]:
        """The options that vary across points, in grid order (capacity adds time_scale)."""
        return [a for a in self.meta.get("axis_columns") or [] if a in self.points.columns]

    @property
    def metrics(self) -> list[str]:
        """The numeric columns a chart can show: every summary metric, and the wall time of a point."""
        names = [*(self.meta.get("metric_columns") or {}), "wall_s"]
        return [c for c in names if c in self.points.columns and pd.api.types.is_numeric_dtype(self.points[c])]

    def complete(self) -> pd.DataFrame:
        """The points with numbers: the only ones a chart shows."""
        return self.points[self.points["status"] == COMPLETE]

    def status_counts(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.points["status"].value_counts(sort=False).items()}


def find_sweeps(runs_dir: str | os.PathLike, max_depth: int = MAX_DEPTH) -> list[Path]:
    """Folders under runs_dir (itself included, up to max_depth levels down) holding a sweep.parquet,
    newest first. Run folders and a sweep's points/ are not searched: they hold no sweeps, and a
    big sweep has thousands of them."""
    root = Path(runs_dir)
    found: list[Path] = []
    if not root.is_dir():
        return found
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        depth = len(here.relative_to(root).parts)
        if SWEEP_FILE in files:
            found.append(here)
            dirs[:] = [d for d in dirs if d != POINTS_DIR]
        if RUN_FILE in files or depth >= max_depth:
            dirs.clear()
        else:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))

    def mtime(p: Path) -> float:
        try:
            return (p / SWEEP_FILE).stat().st_mtime
        except OSError:
            return 0.0

    return sorted(found, key=lambda p: (-mtime(p), str(p)))


RATE_AXIS = "rate (req/s)"  # a capacity search's time_scale axis, shown as the request rate it makes


def _with_rates(points: pd.DataFrame, meta: dict, folder: Path) -> tuple[pd.DataFrame, dict]:
    """A capacity search's points with its time scales as request rates, rounded (3.4 req/s, not
    time_scale 0.17677669529663687), where capacity.json gives the trace's own rate."""
    try:
        trace_rate = float(json.loads((folder / CAPACITY_FILE).read_text())["trace_rate"])
    except (OSError, ValueError, KeyError, TypeError):
        return points, meta
    if "time_scale" not in (meta.get("axis_columns") or []) or not math.isfinite(trace_rate):
        return points, meta
    points = points.copy()
    points[RATE_AXIS] = [float(f"{trace_rate / s:.3g}") for s in points["time_scale"]]
    axes = [RATE_AXIS if a == "time_scale" else a for a in meta["axis_columns"]]
    return points, meta | {"axis_columns": axes}


def open_sweep(path: str | os.PathLike) -> Sweep:
    """A sweep folder (or its sweep.parquet); SweepLoadError saying why it cannot be shown."""
    path = Path(path)
    folder = path.parent if path.name == SWEEP_FILE else path
    if not (folder / SWEEP_FILE).is_file():
        raise SweepLoadError(f"{folder}: no {SWEEP_FILE} (not a sweep folder: make one with `testbed sweep ... --out DIR`)")
    try:
        points, meta = load_sweep(folder)
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...; json ValueError
        raise SweepLoadError(f"{folder / SWEEP_FILE}: unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("axis_columns"), list):
        raise SweepLoadError(f"{folder / SWEEP_FILE}: no testbed.sweep metadata (not written by `testbed sweep`)")
    missing = [c for c in ("point", "status", *meta["axis_columns"]) if c not in points.columns]
    if missing:
        raise SweepLoadError(f"{folder / SWEEP_FILE}: missing column(s) {', '.join(missing)}")
    return Sweep(folder, *_with_rates(points, meta, folder))


# --- axis values ----------------------------------------------------------------------------


def value_label(value: Any) -> str:
    """An axis value as a point's name spells it (on/off, none, 0.5, lpm), whatever pandas made
    of it: numpy scalars, NaN for a none in a numeric column, 8192.0 for 8192."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value)):
        return format_value(None)
    return format_value(value)


def axis_labels(sweep: Sweep, axis: str) -> list[str]:
    """An axis's values, labelled, in grid order (then any value only the table has, e.g. capacity's
    time scales, sorted)."""
    given = next((a["values"] for a in sweep.meta.get("axes") or [] if a.get("name") == axis), [])
    labels = [value_label(v) for v in given]
    present = list(dict.fromkeys(value_label(v) for v in sweep.points[axis]))
    extra = [v for v in present if v not in labels]
    try:
        extra.sort(key=float)  # numbers by value, not as text (10 after 9)
    except ValueError:
        pass
    return list(dict.fromkeys(labels + extra))


def default_axes(sweep: Sweep) -> tuple[str, str | None]:
    """The axes a chart starts on: across, the one with the most values (the load, in a capacity
    search; the last of equals); down, the first other axis (None for a one-axis sweep)."""
    axes = sweep.axes
    x = max(reversed(axes), key=lambda a: len(axis_labels(sweep, a)))
    return x, next((a for a in axes if a != x), None)


# --- the points table -----------------------------------------------------------------------


def run_name(run_dir: Path, runs_dir: Path) -> str:
    """How the Run page names a run folder: its path under the runs dir (what the runs index
    lists), else its absolute path (the Run page opens a linked folder outside the runs dir)."""
    run_dir, root = Path(run_dir).absolute(), Path(runs_dir).absolute()
    return run_dir.relative_to(root).as_posix() if run_dir.is_relative_to(root) else str(run_dir)


def run_link(run_dir: Path, runs_dir: Path) -> str:
    """The Run page's address of a run folder, relative to the current page (so that it works
    under any base URL): run?run=NAME."""
    return "run?run=" + quote(run_name(run_dir, runs_dir), safe="/")


def point_links(sweep: Sweep, rows: pd.DataFrame, runs_dir: Path) -> list[str | None]:
    """The Run page's address of each row's run folder; None for a point without one (pending,
    or failed before its replay started)."""
    if "run_dir" not in rows.columns:
        return [None] * len(rows)
    return [
        run_link(sweep.path / r, runs_dir) if isinstance(r, str) and (sweep.path / r / RUN_FILE).is_file() else None
        for r in rows["run_dir"]
    ]


def points_table(
    sweep: Sweep, runs_dir: Path | None = None, rows: pd.DataFrame | None = None, metrics: Sequence[str] = HEADLINE_METRICS
) -> pd.DataFrame:
    """One row per point (of `rows`, default all) as a person reads it: the axes, status, error
    (where a point has one), the metrics (those the sweep has), then the point's name and (with
    runs_dir) a link to its run on the Run page."""
    df = sweep.points if rows is None else rows
    shown = [m for m in dict.fromkeys(metrics) if m in df.columns]
    error = ["error"] if df["error"].notna().any() else []
    table = df[[*sweep.axes, "status", *error, *shown, "point"]].copy()
    if runs_dir is not None:
        table["run"] = point_links(sweep, df, runs_dir)
    return table.reset_index(drop=True)


# --- a metric over two axes -----------------------------------------------------------------


def metric_grid(sweep: Sweep, metric: str, x: str, y: str | None = None, held: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The metric over the complete points: one column per value of axis x, one row per value of
    axis y (a single row named after the metric when y is None), both in grid order, labelled as
    value_label does. Every other axis is held at the value label held[axis] (default: its first
    value) or, with held[axis] == MEAN, averaged over. A cell without a complete point is NaN; a
    value of x or y without any (every point there failed) is left out."""
    if x == y:
        raise ValueError(f"the two axes must differ (both {x})")
    held = dict(held or {})
    points = sweep.complete()
    keep = pd.Series(True, index=points.index)
    for axis in sweep.axes:
        if axis in (x, y):
            continue
        value = held.get(axis, axis_labels(sweep, axis)[0])
        if value != MEAN:
            keep &= points[axis].map(value_label) == value
    chosen = points[keep]
    xs = axis_labels(sweep, x)
    cells = pd.DataFrame(
        {
            "x": chosen[x].map(value_label),
            "y": chosen[y].map(value_label) if y else metric,
            "v": pd.to_numeric(chosen[metric], errors="coerce").astype(float),
        }
    )
    ys = axis_labels(sweep, y) if y else [metric]
    grid = cells.groupby(["y", "x"], sort=False)["v"].mean().unstack("x") if len(cells) else pd.DataFrame()
    grid = grid.reindex(index=ys, columns=xs)
    grid = grid.dropna(how="all").dropna(axis=1, how="all")
    grid.index.name, grid.columns.name = (y or "metric"), x
    return grid.astype(float)


# --- the Pareto front -----------------------------------------------------------------------


def pareto_front(sweep: Sweep, throughput: str, latency: str) -> pd.DataFrame:
    """The complete points no other complete point beats on both counts (a throughput at least as
    high and a latency at least as low, one of them strictly), by latency then throughput, both
    rising along the front. Equal points are all on it; points without both numbers are not."""
    points = sweep.complete()
    t = pd.to_numeric(points[throughput], errors="coerce").astype(float)
    lat = pd.to_numeric(points[latency], errors="coerce").astype(float)
    ok = t.notna() & lat.notna()
    candidates = pd.DataFrame({"t": t[ok], "l": lat[ok]}).sort_values(["l", "t"], ascending=[True, False], kind="stable")
    on_front: list[Any] = []
    best = -math.inf  # the highest throughput at a strictly lower latency
    for _, group in candidates.groupby("l", sort=True):
        top = group["t"].max()
        if top > best:  # else a faster point has at least this throughput: all of the group is beaten
            on_front += list(group.index[group["t"] == top])  # the rest of the group is beaten by these
            best = top
    front = points.loc[on_front]
    return front.sort_values([latency, throughput], kind="stable")
