"""Plotly figures of runs and sweeps, pure functions of DataFrames and arrays (no Streamlit).

Every time series goes through downsample, so a whole Mooncake run (~143k
steps, millions of tokens) draws as a few thousand points. Times are seconds
on the run's clock (0 = the first arrival); latencies are milliseconds.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from dashboard.downsample import MAX_POINTS, peak_rows, rate_series, step_series
from dashboard.latency import LABELS
from dashboard.timeline import INTERVALS
from testbed.runs.by_arrival import ArrivalGroup
from testbed.runs.compare import STATS
from testbed.runs.metrics import LATENCIES

PALETTE = qualitative.Plotly
MAX_RATE_BINS = 200  # throughput is a rate over bins: fewer, wider bins than the step series
MIN_RATE_BIN_S = 1.0  # narrower, a rate of requests is mostly 0 or 1 per bin
_GRID = ((1, 1), (1, 2), (2, 1), (2, 2))  # the four latencies on a 2x2 grid
LAYOUT = dict(margin=dict(l=60, r=20, t=60, b=40), legend=dict(orientation="h", y=-0.12))


def series_color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _time_step_series(steps: pd.DataFrame, agg: dict[str, str]) -> pd.DataFrame:
    return step_series(steps, "schedule_start", agg, MAX_POINTS)


def latency_cdf_figure(cdfs: Mapping[str, Mapping[str, tuple[np.ndarray, np.ndarray]]]) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT, ITL, E2E, one line per run:
    {run label: {latency: (x in ms, P[X <= x])}} (latency.latency_cdfs)."""
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"{LABELS[m]} (ms)" for m in LATENCIES], vertical_spacing=0.14)
    for i, (label, by_metric) in enumerate(cdfs.items()):
        for metric, (row, col) in zip(LATENCIES, _GRID):
            x, p = by_metric.get(metric, (np.empty(0), np.empty(0)))
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=p,
                    mode="lines",
                    name=label,
                    legendgroup=label,
                    showlegend=metric == LATENCIES[0],
                    line=dict(color=series_color(i), shape="hv"),
                    hovertemplate=f"{label}<br>{LABELS[metric]} %{{x:.2f}} ms<br>P %{{y:.3f}}<extra></extra>",
                ),
                row=row,
                col=col,
            )
    fig.update_yaxes(range=[0, 1.02], title_text="fraction of requests")
    fig.update_layout(title="Latency CDFs", height=620, **LAYOUT)
    return fig


def percentile_bars_figure(summaries: Mapping[str, Mapping]) -> go.Figure:
    """Mean, p50, p90, p99 of each latency as grouped bars, one colour per run: {run label: run.json summary}."""
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"{LABELS[m]} (ms)" for m in LATENCIES], vertical_spacing=0.14)
    for i, (label, summary) in enumerate(summaries.items()):
        for metric, (row, col) in zip(LATENCIES, _GRID):
            y = [summary.get(f"{s}_{metric}_ms") for s in STATS]
            fig.add_trace(
                go.Bar(x=list(STATS), y=y, name=label, legendgroup=label, showlegend=metric == LATENCIES[0], marker_color=series_color(i)),
                row=row,
                col=col,
            )
    fig.update_layout(title="Latency percentiles", barmode="group", height=620, **LAYOUT)
    return fig


def arrival_error_figure(groups: Mapping[str, list[ArrivalGroup]]) -> go.Figure:
    """Each group of consecutive arrivals' mean TTFT and TPOT error against A (percent), one line per
    run B: {run label: its groups} (testbed/runs/by_arrival.py)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["TTFT mean, rel. err (%)", "TPOT mean, rel. err (%)"])
    for i, (label, rows) in enumerate(groups.items()):
        x = [f"{g.first}-{g.last}" for g in rows]
        for col, errors in ((1, [g.ttft_err for g in rows]), (2, [g.tpot_err for g in rows])):
            y = [None if e is None else e * 100 for e in errors]
            fig.add_trace(
                go.Scatter(
                    x=x, y=y, mode="lines+markers", name=label, legendgroup=label, showlegend=col == 1, line=dict(color=series_color(i + 1))
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="requests, in A's arrival order", type="category")
    fig.add_hline(y=0, line=dict(color="gray", width=1))
    fig.update_layout(title="Error by arrival group", height=420, **LAYOUT)
    return fig


def throughput_queue_figure(requests: pd.DataFrame, steps: pd.DataFrame) -> go.Figure:
    """Output tokens/s and finished requests/s over time; running and waiting requests per step."""
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("Throughput", "Queue length"),
        specs=[[{"secondary_y": True}], [{}]],
    )
    if not requests.empty:
        token_times = [t for t in requests["token_times"] if len(t)]
        all_tokens = np.concatenate(token_times) if token_times else np.empty(0)
        span = float(all_tokens.max() - all_tokens.min()) if len(all_tokens) else 0.0
        bins = int(min(MAX_RATE_BINS, max(1, span // MIN_RATE_BIN_S)))
        tokens = rate_series(all_tokens, bins)
        finished = rate_series(requests.loc[requests["status"] == "finished", "finish"].to_numpy(), bins)
        fig.add_trace(
            go.Scatter(x=tokens["time"], y=tokens["rate"], name="output tok/s", line=dict(color=series_color(0), shape="hv")), row=1, col=1
        )
        fig.add_trace(
            go.Scatter(x=finished["time"], y=finished["rate"], name="finished req/s", line=dict(color=series_color(1), shape="hv")),
            row=1,
            col=1,
            secondary_y=True,
        )
    if not steps.empty:
        q = _time_step_series(steps, {"num_running": "max", "num_waiting": "max"})
        fig.add_trace(
            go.Scatter(x=q["time"], y=q["num_running"], name="running", line=dict(color=series_color(2), shape="hv")), row=2, col=1
        )
        fig.add_trace(
            go.Scatter(x=q["time"], y=q["num_waiting"], name="waiting", line=dict(color=series_color(3), shape="hv")), row=2, col=1
        )
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="tok/s", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="req/s", row=1, col=1, secondary_y=True)
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig.update_layout(title="Throughput and queues over time", height=560, **LAYOUT)
    return fig


def batch_figure(steps: pd.DataFrame) -> go.Figure:
    """Batch composition per step: prefill (extend) and decode tokens, and the batch size.
    Binned, each value is the mean per step over the bin."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=("Tokens per step", "Batch size"))
    if not steps.empty:
        # A mixed step (vLLM's scheduler: prefill chunks beside decodes) counts as prefill;
        # its decodes add one token each.
        extend = steps["mode"].astype(str).to_numpy() != "decode"
        per_step = pd.DataFrame(
            {
                "schedule_start": steps["schedule_start"].to_numpy(),
                "prefill_tokens": np.where(extend, steps["num_tokens"], 0),
                "decode_tokens": np.where(extend, 0, steps["num_tokens"]),
                "batch_size": steps["batch_size"].to_numpy(),
            }
        )
        b = _time_step_series(per_step, {"prefill_tokens": "mean", "decode_tokens": "mean", "batch_size": "mean"})
        for i, (col, name) in enumerate((("prefill_tokens", "prefill tokens"), ("decode_tokens", "decode tokens"))):
            fig.add_trace(go.Bar(x=b["time"], y=b[col], name=name, marker_color=series_color(i), marker_line_width=0), row=1, col=1)
        fig.add_trace(
            go.Scatter(x=b["time"], y=b["batch_size"], name="batch size", line=dict(color=series_color(2), shape="hv")), row=2, col=1
        )
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig.update_layout(title="Batch composition", barmode="stack", bargap=0, height=560, **LAYOUT)
    return fig


def cache_hit_series(steps: pd.DataFrame) -> pd.DataFrame:
    """Prefix-cache hit rate over time: per bin and cumulative. Tokens a prefill needed =
    reused from the cache + computed, so the cumulative rate ends at run.json's cache_hit_rate."""
    extend = steps["mode"].astype(str).to_numpy() != "decode"  # extend or mixed
    hit = steps["cache_hit_tokens"].to_numpy(dtype=np.float64)
    need = hit + np.where(extend, steps["num_tokens"].to_numpy(dtype=np.float64), 0.0)
    per = pd.DataFrame({"schedule_start": steps["schedule_start"].to_numpy(), "hit": hit, "need": need})
    binned = _time_step_series(per[need > 0], {"hit": "sum", "need": "sum"})
    cum_hit, cum_need = np.cumsum(binned["hit"].to_numpy()), np.cumsum(binned["need"].to_numpy())
    return pd.DataFrame(
        {
            "time": binned["time"],
            "hit_rate": binned["hit"] / binned["need"],
            "cumulative_hit_rate": np.divide(cum_hit, cum_need, out=np.zeros_like(cum_hit), where=cum_need > 0),
        }
    )


def kv_figure(steps: pd.DataFrame, kv_tokens: int | None) -> go.Figure:
    """KV pool use (held by requests or locked; evictable cache) and the prefix-cache hit rate over time."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=("KV pool", "Prefix cache hit rate"))
    pool = f" (pool {kv_tokens:,} tokens)" if kv_tokens else ""
    if not steps.empty:
        kv = peak_rows(steps, "schedule_start", ["kv_used_tokens", "kv_cached_tokens"])  # both from one step: a real pool state
        for i, (col, name) in enumerate((("kv_used_tokens", "used"), ("kv_cached_tokens", "evictable cache"))):
            fig.add_trace(
                go.Scatter(x=kv["time"], y=kv[col], name=f"KV {name}", stackgroup="kv", line=dict(color=series_color(i), shape="hv")),
                row=1,
                col=1,
            )
        if kv_tokens:
            fig.add_hline(y=kv_tokens, line_dash="dot", line_color="gray", row=1, col=1)
        hits = cache_hit_series(steps)
        fig.add_trace(
            go.Scatter(x=hits["time"], y=hits["hit_rate"], name="hit rate", mode="markers", marker=dict(color=series_color(2), size=4)),
            row=2,
            col=1,
        )
        fig.add_trace(
            go.Scatter(x=hits["time"], y=hits["cumulative_hit_rate"], name="cumulative hit rate", line=dict(color=series_color(3))),
            row=2,
            col=1,
        )
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="hit rate", tickformat=".0%", range=[0, 1.02], row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig.update_layout(title=f"KV cache{pool}", height=560, **LAYOUT)
    return fig


def retraction_figure(steps: pd.DataFrame) -> go.Figure:
    """Requests retracted back to the waiting queue (KV ran out) over time, and their running total."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    if not steps.empty:
        r = _time_step_series(steps, {"num_retracted": "sum"})
        fig.add_trace(go.Bar(x=r["time"], y=r["num_retracted"], name="retracted", marker_color=series_color(4)))
        fig.add_trace(
            go.Scatter(x=r["time"], y=np.cumsum(r["num_retracted"]), name="total", line=dict(color=series_color(5), shape="hv")),
            secondary_y=True,
        )
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="retracted", secondary_y=False)
    fig.update_yaxes(title_text="total", secondary_y=True)
    fig.update_xaxes(title_text="time (s)")
    fig.update_layout(title="Retractions", height=340, **LAYOUT)
    fig.update_layout(legend_y=-0.4)  # below the axis title of this short figure
    return fig


def timeline_figure(intervals: pd.DataFrame) -> go.Figure:
    """CPU and device intervals of some steps as bars on two lanes (timeline.intervals of a window of steps).
    Overlap shows as the device lane busy while the CPU lane schedules the next step."""
    fig = go.Figure()
    # CPU stages one colour each; forwards by mode, outlined so that back-to-back ones stay apart.
    parts = [(name, intervals["interval"] == name, {}) for name, lane in INTERVALS if lane == "CPU"]
    for mode in ("extend", "mixed", "decode"):
        rows = (intervals["interval"] == "device") & (intervals["mode"] == mode)
        parts.append((f"forward ({mode})", rows, dict(marker_line_width=1, marker_line_color="white")))
    for i, (label, rows, style) in enumerate(parts):
        part = intervals[rows]
        lane = "device" if label.startswith("forward") else "CPU"
        start_ms = part["start"].to_numpy() * 1000.0
        dur_ms = (part["end"].to_numpy() - part["start"].to_numpy()) * 1000.0
        fig.add_trace(
            go.Bar(
                base=start_ms,
                x=dur_ms,
                y=[lane] * len(part),
                orientation="h",
                name=label,
                marker_color=series_color(i),
                customdata=np.stack([part["step"], part["batch_size"], part["num_tokens"]], axis=-1) if len(part) else None,
                hovertemplate=f"{label} step %{{customdata[0]}} (batch %{{customdata[1]}}, %{{customdata[2]}} tokens)"
                "<br>%{base:.3f} ms + %{x:.3f} ms<extra></extra>",
                **({"marker_line_width": 0} | style),
            )
        )
    fig.update_yaxes(categoryorder="array", categoryarray=["device", "CPU"])
    fig.update_xaxes(title_text="time (ms)")
    fig.update_layout(title="Step timeline: CPU and device", barmode="overlay", bargap=0.35, height=320, **LAYOUT)
    fig.update_layout(legend_y=-0.45)  # below the axis title of this short figure
    return fig


# --- sweeps (sweep_view) --------------------------------------------------------------------


def _cell_text(v: float) -> str:
    return "" if pd.isna(v) else f"{v:.4g}"


def sweep_metric_figure(grid: pd.DataFrame, metric: str, x: str, y: str | None, kind: str = "heatmap") -> go.Figure:
    """A metric over one or two sweep axes (sweep_view.metric_grid): a heat map of y against x with
    the value in each cell, or (kind "lines", or no y) one line per value of y. The axes are
    categories in grid order: 0.5, 1, 2 evenly spaced, as a grid is."""
    fig = go.Figure()
    xs = [str(c) for c in grid.columns]
    if y is not None and kind == "heatmap":
        z = grid.to_numpy(dtype=float)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=xs,
                y=[str(i) for i in grid.index],
                colorscale="Viridis",
                colorbar=dict(title=dict(text=metric)),
                text=[[_cell_text(v) for v in row] for row in z],
                texttemplate="%{text}",
                hovertemplate=f"{x}=%{{x}}<br>{y}=%{{y}}<br>{metric} %{{z:.4g}}<extra></extra>",
            )
        )
        fig.update_yaxes(type="category", title_text=y)
        title = f"{metric} by {x} and {y}"
    else:
        for i, (label, row) in enumerate(grid.iterrows()):
            name = f"{y}={label}" if y is not None else metric
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=row.to_numpy(dtype=float),
                    mode="lines+markers",
                    name=name,
                    line=dict(color=series_color(i)),
                    hovertemplate=f"{name}<br>{x}=%{{x}}<br>{metric} %{{y:.4g}}<extra></extra>",
                )
            )
        fig.update_yaxes(title_text=metric)
        title = f"{metric} by {x}" + (f", one line per {y}" if y is not None else "")
    fig.update_xaxes(type="category", title_text=x)
    fig.update_layout(title=title, height=480, **LAYOUT)
    return fig


def pareto_figure(points: pd.DataFrame, front: pd.DataFrame, throughput: str, latency: str) -> go.Figure:
    """Every point (sweep_view's complete points) at (latency, throughput), the Pareto front
    (sweep_view.pareto_front) highlighted and joined in order; hovering shows a point's name."""
    fig = go.Figure()

    def hover(name: str) -> str:
        return f"%{{text}}<br>{latency} %{{x:.4g}}<br>{throughput} %{{y:.4g}}<extra>{name}</extra>"

    fig.add_trace(
        go.Scatter(
            x=points[latency],
            y=points[throughput],
            text=points["point"],
            mode="markers",
            name="points",
            marker=dict(color="lightgray", size=9, line=dict(width=1, color="gray")),
            hovertemplate=hover("point"),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=front[latency],
            y=front[throughput],
            text=front["point"],
            mode="lines+markers",
            name="Pareto front",
            marker=dict(color=series_color(1), size=11),
            line=dict(color=series_color(1), shape="hv"),
            hovertemplate=hover("front"),
        )
    )
    fig.update_xaxes(title_text=f"{latency} (lower is better)")
    fig.update_yaxes(title_text=f"{throughput} (higher is better)")
    fig.update_layout(title=f"Pareto front: {throughput} against {latency}", height=480, **LAYOUT)
    return fig
