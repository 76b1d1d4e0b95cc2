"""The Runs table: every run folder under a directory, one row each, broken ones included.

Only run.json and wall.json are read (plus the parquet footers, to catch a
truncated table), so listing a directory of large runs stays fast; the tables
themselves are loaded by the Run page.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import pandas as pd
import pyarrow.parquet as pq

from testbed.runs.folder import (
    REQUESTS_FILE,
    RUN_FILE,
    STEPS_FILE,
    WALL_FILE,
    RunLoadError,
    effective_status,
    holds_only_profiles,
    read_run_meta,
)
from testbed.studies.capacity import CAPACITY_FILE
from testbed.studies.sweep import POINTS_DIR, SWEEP_FILE

# Summary keys shown as headline numbers, in this order.
HEADLINE_KEYS = (
    "completed",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "request_throughput",
    "output_throughput",
    "cache_hit_rate",
)
COLUMNS = (
    "name",
    "status",
    "trace",
    "mode",
    "model",
    "hardware",
    "scheduler",
    "policy",
    "overlap",
    "chunked_prefill_size",
    "page_size",
    "kv_tokens",
    "time_scale",
    "max_requests",
    "profile",
    "date",
    *HEADLINE_KEYS,
    "error",
    "path",
    "trace_sha256",
    "study",  # the sweep or capacity folder a point's run belongs to (its name in the index), else None
)
INT_COLUMNS = ("chunked_prefill_size", "page_size", "kv_tokens", "max_requests", "completed")
ERROR_STATUS = "error"  # the status of a folder that does not load


def find_run_folders(runs_dir: Path) -> list[Path]:
    """Folders holding a run.json, at any depth (a sweep may nest its runs), plus
    every top-level folder that holds none: those are listed as errors, so a
    folder that lost its run.json does not silently vanish from the table (but for
    a sweep's folder with no point run yet: the What-if page opens sweeps)."""
    found: list[Path] = []
    if not runs_dir.is_dir():
        return found
    for top in sorted(p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        inside = []
        for root, dirs, files in os.walk(top):
            if RUN_FILE in files:
                inside.append(Path(root))
                dirs.clear()  # a run folder's subfolders are not runs
            else:
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        # A folder of cost profiles (calibrate's default runs/profiles/) is not a run that lost its run.json.
        found += inside or ([] if (top / SWEEP_FILE).is_file() or holds_only_profiles(top) else [top])
    return found


def _check_tables(path: Path, status: str) -> None:
    """A complete run has both tables, and their footers read (a truncated file's does not)."""
    for name in (REQUESTS_FILE, STEPS_FILE):
        f = path / name
        if not f.is_file():
            if status == "complete":
                raise RunLoadError(f"{f}: missing")
            continue
        try:
            pq.read_metadata(f)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...
            raise RunLoadError(f"{f}: unreadable parquet ({e})") from None


def _date(path: Path) -> pd.Timestamp:
    """When the run was made: wall.json's created_at, else run.json's mtime (a run still going)."""
    try:
        created = json.loads((path / WALL_FILE).read_text()).get("created_at")
        if created:
            return pd.Timestamp(created).tz_convert("UTC").tz_localize(None)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return pd.Timestamp((path / RUN_FILE).stat().st_mtime, unit="s")
    except OSError:
        return pd.NaT


def index_row(path: Path, runs_dir: Path) -> dict:
    """One row of the table; a folder that does not load gets status "error" and its message."""
    row: dict = {c: None for c in COLUMNS}
    row["name"] = path.relative_to(runs_dir).as_posix() if path.is_relative_to(runs_dir) else str(path)
    row["path"] = str(path)
    if path.parent.name == POINTS_DIR:  # DIR/points/<point>: a point of a sweep or capacity search in DIR
        study = path.parent.parent
        row["study"] = study.relative_to(runs_dir).as_posix() if study.is_relative_to(runs_dir) else str(study)
    try:
        meta = read_run_meta(path)
        status = effective_status(path, meta)  # a run whose process died is incomplete
        _check_tables(path, status)
    except RunLoadError as e:
        row["status"], row["error"] = ERROR_STATUS, str(e)
        return row
    opts = meta.get("options") or {}
    trace = meta.get("trace") or {}
    summary = meta.get("summary") or {}
    scheduler = meta.get("scheduler") or {}
    profile = opts.get("profile")
    row.update(
        status=status,
        error=meta.get("error"),  # a failed run says why
        trace=trace.get("path"),
        trace_sha256=trace.get("sha256"),
        mode=meta.get("mode"),
        model=meta.get("model", opts.get("model")),
        hardware=meta.get("hardware", opts.get("hardware")),
        # Which scheduler ran (an imported run: the engine's); runs from before the
        # vLLM scheduler existed ran SGLang's.
        scheduler=opts.get("scheduler") or scheduler.get("name") or "sglang",
        policy=opts.get("policy"),
        overlap=opts.get("overlap"),
        chunked_prefill_size=opts.get("chunked_prefill_size"),
        page_size=opts.get("page_size"),
        # The pool the scheduler got, however it was sized.
        kv_tokens=summary.get("kv_tokens", scheduler.get("kv_tokens", opts.get("kv_tokens"))),
        time_scale=opts.get("time_scale"),
        max_requests=opts.get("max_requests"),
        profile=Path(profile).name if profile else None,
        date=_date(path),
    )
    for key in HEADLINE_KEYS:
        v = summary.get(key)
        row[key] = v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return row


def scan_runs(runs_dir: str | os.PathLike, extra: Sequence[Path] = ()) -> pd.DataFrame:
    """Every run under runs_dir, and the run folders `extra` (a link to a run kept elsewhere,
    named by its path), newest first; columns COLUMNS."""
    runs_dir = Path(runs_dir)
    folders = find_run_folders(runs_dir)
    seen = {p.absolute() for p in folders}
    folders += [p for p in map(Path, extra) if p.absolute() not in seen]
    rows = [index_row(p, runs_dir) for p in folders]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for key in HEADLINE_KEYS:
        df[key] = pd.to_numeric(df[key])
    # Nullable dtypes: a broken folder's empty cells must not turn 8192 into 8192.0.
    for key in INT_COLUMNS:
        df[key] = pd.to_numeric(df[key]).astype("Int64")
    df["overlap"] = df["overlap"].astype("boolean")
    df["date"] = pd.to_datetime(df["date"])
    return df.sort_values(["date", "name"], ascending=[False, True], na_position="last", ignore_index=True)


# What a real run and its simulation must share to be compared (testbed compare's differences,
# as far as the index knows them).
SAME_WORKLOAD = (
    "trace_sha256",
    "model",
    "policy",
    "overlap",
    "chunked_prefill_size",
    "page_size",
    "kv_tokens",
    "time_scale",
    "max_requests",
)
# What two runs must share for their comparison to mean something at all: the same requests at the
# same load on the same model (the options may differ: that is a what-if).
SAME_LOAD = ("trace_sha256", "model", "time_scale", "max_requests")
MEASURED_MODES = ("real", "imported", "server")


def _same(rows: pd.DataFrame, run: pd.Series, columns: tuple[str, ...]) -> pd.Series:
    same = pd.Series(True, index=rows.index)
    for column in columns:
        same &= rows[column].astype(object).fillna("none") == ("none" if pd.isna(run[column]) else run[column])
    return same & (rows["name"] != run["name"])


def comparable_pair(index: pd.DataFrame) -> list[str]:
    """What the Compare page opens on: the newest complete measured run (real, server or imported) and
    the newest complete sim of the same trace, model and options; else the newest two complete
    runs of the same trace, model and load (a measured one first); else nothing: the page asks
    (two runs of different traces compare nothing). The index is newest first."""
    complete = index[index["status"] == "complete"]
    measured = complete["mode"].isin(MEASURED_MODES)
    sims = complete[complete["mode"] == "sim"]
    for _, real in complete[measured].iterrows():
        same = _same(sims, real, SAME_WORKLOAD)
        if same.any():
            return [real["name"], sims.loc[same, "name"].iloc[0]]
    for _, run in pd.concat([complete[measured], complete[~measured]]).iterrows():
        same = _same(complete, run, SAME_LOAD)
        if same.any():
            return [run["name"], complete.loc[same, "name"].iloc[0]]
    return []


def studies(index: pd.DataFrame, runs_dir: str | os.PathLike) -> pd.DataFrame:
    """One row per sweep or capacity search of the index (its points grouped): study, kind,
    points, how many complete, the others' statuses, trace, mode, model, the newest point's date.
    Newest first."""
    points = index[index["study"].notna()]
    rows = []
    for study, group in points.groupby("study", sort=False):
        folder = Path(study) if Path(study).is_absolute() else Path(runs_dir) / study
        others = group["status"][group["status"] != "complete"].value_counts()
        rows.append(
            {
                "study": study,
                "kind": "capacity" if (folder / CAPACITY_FILE).is_file() else "sweep",
                "points": len(group),
                "complete": int((group["status"] == "complete").sum()),
                "not complete": ", ".join(f"{n} {s}" for s, n in others.items()) or None,
                "trace": group["trace"].dropna().iloc[0] if group["trace"].notna().any() else None,
                "mode": ", ".join(sorted(group["mode"].dropna().unique())) or None,
                "model": ", ".join(sorted(group["model"].dropna().unique())) or None,
                "date (UTC)": group["date"].max(),
            }
        )
    columns = ["study", "kind", "points", "complete", "not complete", "trace", "mode", "model", "date (UTC)"]
    return pd.DataFrame(rows, columns=columns).sort_values("date (UTC)", ascending=False, ignore_index=True)


def loadable(index: pd.DataFrame) -> pd.DataFrame:
    """The rows a Run or Compare page can open."""
    return index[index["status"] != ERROR_STATUS]


# The Runs table as a person reads it: column -> header. What ran, its headline
# numbers, then the rest of its options (a wide table scrolls; these stay in view).
DISPLAY_COLUMNS = {
    "name": "run",
    "status": "status",
    "trace": "trace",
    "mode": "mode",
    "model": "model",
    "hardware": "hardware",
    "scheduler": "scheduler",
    "policy": "policy",
    "overlap": "overlap",
    "completed": "completed",
    "mean_ttft_ms": "TTFT mean (ms)",
    "p99_ttft_ms": "TTFT p99 (ms)",
    "mean_tpot_ms": "TPOT mean (ms)",
    "p99_tpot_ms": "TPOT p99 (ms)",
    "request_throughput": "req/s",
    "output_throughput": "output tok/s",
    "cache_hit_rate": "cache hit rate",
    "chunked_prefill_size": "chunk",
    "page_size": "page",
    "kv_tokens": "KV tokens",
    "time_scale": "time scale",
    "max_requests": "max requests",
    "profile": "profile",
    "date": "date (UTC)",
    "error": "error",
}


def display_frame(index: pd.DataFrame, drop_empty: bool = True) -> pd.DataFrame:
    """The index with readable headers, without the columns only the app uses (path, trace hash)
    and, with drop_empty, without the columns empty in every row (no profile, no error...)."""
    shown = index[list(DISPLAY_COLUMNS)]
    if drop_empty:
        shown = shown.loc[:, [c for c in shown.columns if c in ("name", "status") or shown[c].notna().any()]]
    return shown.rename(columns=DISPLAY_COLUMNS)


def filter_runs(index: pd.DataFrame, text: str = "", **equal: list) -> pd.DataFrame:
    """Rows whose name, trace, model, hardware, scheduler, policy or error contain text (case-insensitive),
    and whose column c is one of equal[c] for every non-empty equal[c] (e.g. mode=["sim"])."""
    keep = pd.Series(True, index=index.index)
    if text.strip():
        needle = text.strip().lower()
        hay = pd.Series("", index=index.index)
        for column in ("name", "trace", "model", "hardware", "scheduler", "policy", "error"):
            hay = hay + " " + index[column].astype(object).fillna("").astype(str).str.lower()
        keep &= hay.str.contains(needle, regex=False)
    for column, values in equal.items():
        if values:
            keep &= index[column].isin(values)
    return index[keep]
