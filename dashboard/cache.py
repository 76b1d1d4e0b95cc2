"""Runs and what is drawn from them, cached across reruns of a page.

Keys are the folder's path and run.json's modification time: run.json is the
last file a replay writes, so a run rewritten in place (or still running) is
loaded again, and an unchanged one never is.

The Run itself is a cache *resource* (one shared object, never copied): with
st.cache_data every rerun would unpickle a copy of its tables, 0.35 s for a
whole Mooncake run (60 MB), longer than reading the parquet files. The app
never modifies a Run. What is drawn from it (CDF points, figures) is small and
cached as data.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from dashboard import charts
from dashboard.latency import latency_cdfs
from testbed.runs.folder import RUN_FILE, Run, load_run

MAX_RUNS = 8  # a whole Mooncake run is a few hundred MB in memory
Cdfs = dict[str, tuple[np.ndarray, np.ndarray]]


def run_key(path: str | Path) -> tuple[str, int]:
    """(path, mtime of run.json in ns): the cache key of a run folder."""
    path = Path(path)
    return str(path), (path / RUN_FILE).stat().st_mtime_ns


@st.cache_resource(max_entries=MAX_RUNS, show_spinner="Loading the run...")
def _load(path: str, mtime_ns: int) -> Run:
    return load_run(path)


@st.cache_data(max_entries=64, show_spinner=False)
def _cdfs(path: str, mtime_ns: int) -> Cdfs:
    return latency_cdfs(_load(path, mtime_ns).requests)


@st.cache_data(max_entries=MAX_RUNS, show_spinner="Drawing...")
def _run_figures(path: str, mtime_ns: int, label: str) -> dict[str, go.Figure]:
    run = _load(path, mtime_ns)
    return {
        "latency": charts.latency_cdf_figure({label: _cdfs(path, mtime_ns)}),
        "throughput": charts.throughput_queue_figure(run.requests, run.steps),
        "batch": charts.batch_figure(run.steps),
        "kv": charts.kv_figure(run.steps, run.summary.get("kv_tokens")),
        "retractions": charts.retraction_figure(run.steps),
    }


def load(path: str | Path) -> Run:
    """load_run, cached; raises RunLoadError, OSError or ValueError (a bad parquet) as it does."""
    return _load(*run_key(path))


def cdfs(path: str | Path) -> Cdfs:
    """The run's latency CDFs (latency.latency_cdfs), cached."""
    return _cdfs(*run_key(path))


def run_figures(path: str | Path, label: str) -> dict[str, go.Figure]:
    """The Run page's figures, but the timeline (it follows a window the user moves), cached."""
    return _run_figures(*run_key(path), label)
