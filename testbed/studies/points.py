"""One point of a sweep, its result, and running it: what the local and the Ray runner share.

A point is one replay: `testbed replay TRACE <options> --out <run_dir>`. Both runners call
run_point, so both give the same run folders and the same results.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from testbed.options import ReplayOptions
from testbed.replay import finished_run_meta, replay
from testbed.runs.folder import WALL_FILE, RunLoadError, effective_status, read_run_meta


@dataclass(frozen=True)
class SweepPoint:
    name: str  # folder under DIR/points, and the "point" column of sweep.parquet
    axes: tuple[tuple[str, Any], ...]  # (option, value) in grid order
    options: ReplayOptions  # the base options with the axis values
    run_dir: Path


@dataclass
class PointResult:
    name: str
    status: str  # complete | failed | incomplete (replay's run statuses), pending (not started), skipped (options that cannot run together)
    summary: dict | None = None
    error: str | None = None
    wall_s: float | None = None
    resumed: bool = False  # found finished in the out folder, not run again


OnResult = Callable[[SweepPoint, PointResult], None]  # a runner reports each result as it arrives

DRAIN_S = 60.0  # after a stop, how long the running points get to write their folders


def run_point(trace_path: str, point: SweepPoint) -> PointResult:
    """One point: exactly `testbed replay TRACE <options> --out <run_dir>`. A failure is a
    result, not an exception, so that the other points go on."""
    start = time.perf_counter()
    try:
        r = replay(trace_path, point.options, out=point.run_dir)
    except Exception as e:  # noqa: BLE001 - any error of one point is that point's result
        return PointResult(point.name, "failed", None, f"{type(e).__name__}: {e}", round(time.perf_counter() - start, 3))
    return PointResult(point.name, r.status, r.summary, None, round(r.wall_s, 3))


def finished_result(point: SweepPoint, trace_sha256: str) -> PointResult | None:
    """The result of a point whose folder already holds a complete run of the same trace
    and options (what --resume skips), else None."""
    meta = finished_run_meta(point.run_dir, trace_sha256, point.options)
    if meta is None:
        return None
    try:
        wall_s = json.loads((point.run_dir / WALL_FILE).read_text()).get("wall_s")
    except (OSError, ValueError, AttributeError):
        wall_s = None
    return PointResult(point.name, "complete", meta.get("summary"), None, wall_s, resumed=True)


def run_point_until_stopped(trace_path: str, point: SweepPoint) -> PointResult | None:
    """run_point, where a stop (KeyboardInterrupt: Ctrl-C, SIGTERM, a cancelled Ray task) is a
    result too: the point's folder as the interrupted replay left it, or None if the point had
    not started (no run folder yet)."""
    try:
        return run_point(trace_path, point)
    except KeyboardInterrupt:
        return folder_result(point)


def folder_result(point: SweepPoint, trace_sha256: str | None = None) -> PointResult | None:
    """What the point's folder holds: its run's status and summary (a run that says "running"
    with no writer left is incomplete), or None if it holds no run (of this trace, if given)."""
    try:
        meta = read_run_meta(point.run_dir)
    except RunLoadError:
        return None
    if trace_sha256 is not None and (meta.get("trace") or {}).get("sha256") != trace_sha256:
        return None
    return PointResult(point.name, effective_status(point.run_dir, meta), meta.get("summary"), meta.get("error"))
