"""Runs and what is drawn from them, cached across reruns of a page.

Keys are the folder's path and its stamp (testbed.runs.folder.folder_stamp: run.json's
modification time, the journals' of a run still going, whether its writer is alive), so a
run rewritten in place, still running or killed is loaded again, and an unchanged one never is.

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

from dashboard import charts, cluster_charts
from dashboard.latency import latency_cdfs
from testbed.runs.folder import Run, folder_stamp, load_run

MAX_RUNS = 8  # a whole Mooncake run is a few hundred MB in memory
Cdfs = dict[str, tuple[np.ndarray, np.ndarray]]


def run_key(path: str | Path) -> tuple[str, tuple]:
    """(path, folder stamp): the cache key of a run folder."""
    return str(path), folder_stamp(path)


@st.cache_resource(max_entries=MAX_RUNS, show_spinner="Loading the run...")
def _load(path: str, stamp: tuple) -> Run:
    return load_run(path)


@st.cache_data(max_entries=64, show_spinner=False)
def _cdfs(path: str, stamp: tuple) -> Cdfs:
    return latency_cdfs(_load(path, stamp).requests)


@st.cache_data(max_entries=MAX_RUNS, show_spinner="Drawing...")
def _run_figures(path: str, stamp: tuple, label: str) -> dict[str, go.Figure]:
    run = _load(path, stamp)
    figures = {
        "latency": charts.latency_cdf_figure({label: _cdfs(path, stamp)}),
        "throughput": charts.throughput_queue_figure(run.requests, run.steps),
        "batch": charts.batch_figure(run.steps),
        "kv": charts.kv_figure(run.steps, run.summary.get("kv_tokens")),
        "retractions": charts.retraction_figure(run.steps),
    }
    if cluster_charts.instance_count(run.steps) > 1:
        figures["instances"] = cluster_charts.instance_load_figure(run.steps, run.summary.get("kv_tokens"))
        figures["routing"] = cluster_charts.routing_figure(run.requests)
    return figures


def load(path: str | Path) -> Run:
    """load_run, cached; raises RunLoadError, OSError or ValueError (a bad parquet) as it does."""
    return _load(*run_key(path))


def cdfs(path: str | Path) -> Cdfs:
    """The run's latency CDFs (latency.latency_cdfs), cached."""
    return _cdfs(*run_key(path))


def run_figures(path: str | Path, label: str) -> dict[str, go.Figure]:
    """The Run page's figures, but the timeline (it follows a window the user moves), cached."""
    return _run_figures(*run_key(path), label)
