"""A run folder: what one replay leaves behind, in the same schema for sim and real.

    run.json          config, versions, trace path and hash, status, summary
    requests.parquet  one row per request (testbed.runs.metrics.requests_frame)
    steps.parquet     one row per forward step (scheduler.step_log.STEP_COLUMNS)
    wall.json         when it ran and how long it took on the wall clock

run.json, requests.parquet and steps.parquet depend only on the trace, the
options and the seed (a simulated run is reproducible file for file); wall.json
holds what differs between two runs of the same thing. run.json is written
first with status "running", so an interrupted run is a folder marked
"incomplete" (or still "running" if the process died) that still loads.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from scheduler.step_log import STEP_COLUMNS

RUN_FILE = "run.json"
REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
WALL_FILE = "wall.json"


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, obj: dict) -> None:
    _write_atomic(path, lambda p: p.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n"))


def write_parquet(path: Path, df: pd.DataFrame) -> None:
    _write_atomic(path, lambda p: df.to_parquet(p, index=False))


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("testbed", "simpy", "pandas", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def steps_frame(cols: dict) -> pd.DataFrame:
    # Ctrl-C can land between two columns' appends: keep only whole rows.
    n = min(len(cols[name]) for name in STEP_COLUMNS)
    return pd.DataFrame({name: cols[name][:n] for name in STEP_COLUMNS})


@dataclass
class Run:
    path: Path
    meta: dict
    requests: pd.DataFrame
    steps: pd.DataFrame
    wall: dict

    @property
    def summary(self) -> dict:
        return self.meta.get("summary") or {}

    @property
    def status(self) -> str:
        return self.meta.get("status", "unknown")


class RunLoadError(Exception):
    pass


def read_run_meta(path: Path) -> dict:
    """run.json of a run folder; RunLoadError saying why it cannot be used."""
    run_file = path / RUN_FILE
    if not run_file.is_file():
        raise RunLoadError(f"{path}: not a run folder (no {RUN_FILE})")
    try:
        meta = json.loads(run_file.read_text())
    except json.JSONDecodeError as e:
        raise RunLoadError(f"{run_file}: bad JSON at line {e.lineno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RunLoadError(f"{run_file}: {e}") from None
    if not isinstance(meta, dict):
        raise RunLoadError(f"{run_file}: not a JSON object")
    summary = meta.get("summary")
    if summary is not None and not isinstance(summary, dict):
        raise RunLoadError(f"{run_file}: summary is not a JSON object")
    return meta


def load_run(path: str | os.PathLike) -> Run:
    """Load a run folder; an incomplete run loads with whatever tables it has."""
    path = Path(path)
    meta = read_run_meta(path)
    tables = {}
    for name in (REQUESTS_FILE, STEPS_FILE):
        f = path / name
        tables[name] = pd.read_parquet(f) if f.is_file() else pd.DataFrame()
    wall_file = path / WALL_FILE
    wall = json.loads(wall_file.read_text()) if wall_file.is_file() else {}
    return Run(path, meta, tables[REQUESTS_FILE], tables[STEPS_FILE], wall)
