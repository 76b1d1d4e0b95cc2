"""The What-if page's "Open a sweep" section (Streamlit): a sweep's points, a metric over two of
its axes, and the Pareto front of throughput against latency. The numbers come from
sweep_view, the figures from charts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import charts, ui
from dashboard.sweep_view import (
    DEFAULT_LATENCY,
    DEFAULT_METRIC,
    DEFAULT_THROUGHPUT,
    MEAN,
    Sweep,
    SweepLoadError,
    axis_labels,
    default_axes,
    find_sweeps,
    metric_grid,
    open_sweep,
    pareto_front,
    points_table,
)

NO_AXIS = "none"
PICKED_KEY, TYPED_KEY = "sweep_picked", "sweep_typed"  # the picker and the text box
TYPED_SWEEPS_KEY = "sweeps_typed"  # folders typed so far this session: the picker lists them too
CHART_KINDS = ("heat map", "lines")


def _index(options: list[str], preferred: str, fallback: int = 0) -> int:
    return options.index(preferred) if preferred in options else fallback


def _column_config(table: pd.DataFrame) -> dict:
    """Numbers as the Runs table shows them; the run column a link to the Run page."""
    number = st.column_config.NumberColumn
    config: dict = {"run": st.column_config.LinkColumn("run", display_text="open", help="the point's run on the Run page")}
    for column in table.columns:
        if column.endswith("_ms") or column == "request_throughput":
            config[column] = number(format=ui.MS)
        elif column.endswith("_throughput"):
            config[column] = number(format=ui.RATE)
        elif column == "cache_hit_rate":
            config[column] = number(format=ui.PERCENT)
        elif column == "completed":
            config[column] = number(format=ui.COUNT)
    return config


def show(runs_dir: Path) -> None:
    st.header("Open a sweep")
    st.caption(
        f"A folder written by `testbed sweep` or `testbed capacity` (`--out DIR`), found in `{runs_dir}` or typed. "
        "Every point is listed; only complete points are drawn."
    )
    # One sweep is shown: the picker's. A folder typed joins its list and becomes its choice; a
    # choice from the list clears what was typed, so the two never name different sweeps.
    typed_before = st.session_state.setdefault(TYPED_SWEEPS_KEY, [])
    found = list(dict.fromkeys([str(p) for p in find_sweeps(runs_dir)] + typed_before))
    c_found, c_typed = st.columns(2)

    def typed_changed() -> None:
        typed = st.session_state[TYPED_KEY].strip()
        if typed:
            st.session_state[TYPED_SWEEPS_KEY] = list(dict.fromkeys([*st.session_state[TYPED_SWEEPS_KEY], typed]))
            st.session_state[PICKED_KEY] = typed

    if st.session_state.get(PICKED_KEY) not in (None, *found):
        del st.session_state[PICKED_KEY]  # a folder that is gone
    path = c_found.selectbox(
        "Sweep",
        found,
        index=0 if found else None,
        placeholder=f"no sweep found in {runs_dir}",
        key=PICKED_KEY,
        on_change=lambda: st.session_state.update({TYPED_KEY: ""}),
    )
    c_typed.text_input("or another sweep folder", placeholder="path/to/DIR (holding sweep.parquet)", key=TYPED_KEY, on_change=typed_changed)
    if not path:
        return
    try:
        sweep = open_sweep(path)
    except SweepLoadError as e:
        st.error(f"This sweep does not open: {e}")
        return
    _points(sweep, runs_dir)
    if sweep.complete().empty or not sweep.metrics:
        st.info("No point of this sweep is complete: there is nothing to draw.")
        return
    if sweep.axes:  # a sweep without --grid is one point: nothing to draw against
        _metric_chart(sweep)
    _pareto(sweep, runs_dir)


def _points(sweep: Sweep, runs_dir: Path) -> None:
    counts = sweep.status_counts()
    trace = (sweep.meta.get("trace") or {}).get("path", "?")
    shape = " × ".join(f"{a} ({len(axis_labels(sweep, a))})" for a in sweep.axes) or "no axes"
    st.markdown(
        f"`{sweep.path}`: trace `{trace}`, {len(sweep.points)} point{'s' * (len(sweep.points) != 1)} over {shape}: "
        + ", ".join(f"{n} {status}" for status, n in counts.items())
    )
    not_drawn = sweep.points[sweep.points["status"] != "complete"]
    if len(not_drawn):
        st.warning(
            f"{len(not_drawn)} point(s) not complete are listed below with their error but left out of the charts: "
            + ", ".join(f"{p} ({s})" for p, s in zip(not_drawn["point"], not_drawn["status"]))
        )
    table = points_table(sweep, runs_dir)
    st.dataframe(table, hide_index=True, column_config=_column_config(table))


def _metric_chart(sweep: Sweep) -> None:
    st.subheader("A metric over the axes")
    metrics, axes = sweep.metrics, sweep.axes
    c_metric, c_x, c_y, c_kind = st.columns(4)
    metric = c_metric.selectbox("Metric", metrics, index=_index(metrics, DEFAULT_METRIC))
    x0, y0 = default_axes(sweep)
    x = c_x.selectbox("X axis", axes, index=axes.index(x0))
    y_options = [NO_AXIS, *(a for a in axes if a != x)]
    y_index = _index(y_options, y0 or NO_AXIS, 1 if len(y_options) > 1 else 0)  # X changed: y0 may be X now
    y_choice = c_y.selectbox("Y axis", y_options, index=y_index, help="none: a line of the metric against X")
    y = None if y_choice == NO_AXIS else y_choice
    kind = c_kind.radio("Chart", CHART_KINDS, horizontal=True, disabled=y is None, help="lines: one line per value of Y")
    others = [a for a in axes if a not in (x, y)]
    held: dict[str, str] = {}
    if others:
        columns = st.columns(min(len(others), 4))
        for i, axis in enumerate(others):
            held[axis] = columns[i % len(columns)].selectbox(f"Hold {axis} at", [*axis_labels(sweep, axis), MEAN])
        st.caption(f"Each other axis is held at the value picked, or averaged over its values with '{MEAN}'.")
    grid = metric_grid(sweep, metric, x, y, held)
    if grid.empty:
        st.info("No complete point at these values.")
        return
    st.plotly_chart(charts.sweep_metric_figure(grid, metric, x, y, "lines" if kind == "lines" else "heatmap"))


def _pareto(sweep: Sweep, runs_dir: Path) -> None:
    st.subheader("Pareto front")
    throughputs = [m for m in sweep.metrics if m.endswith("throughput")]
    latencies = [m for m in sweep.metrics if m.endswith("_ms")]
    if not throughputs or not latencies:
        st.info("This sweep has no throughput or no latency metric.")
        return
    c_t, c_l = st.columns(2)
    throughput = c_t.selectbox("Throughput (higher is better)", throughputs, index=_index(throughputs, DEFAULT_THROUGHPUT))
    latency = c_l.selectbox("Latency (lower is better)", latencies, index=_index(latencies, DEFAULT_LATENCY))
    front = pareto_front(sweep, throughput, latency)
    st.plotly_chart(charts.pareto_figure(sweep.complete(), front, throughput, latency))
    st.caption(
        f"{len(front)} of {len(sweep.complete())} complete points are on the front: no other point is "
        f"at least as good on both {throughput} and {latency} and better on one."
    )
    table = points_table(sweep, runs_dir, rows=front, metrics=[throughput, latency]).drop(columns=["status", "error"], errors="ignore")
    st.dataframe(table, hide_index=True, column_config=_column_config(table))
