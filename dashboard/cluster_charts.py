"""Figures of a cluster run (testbed replay --replicas N): each instance's load over time, and
where the router sent the requests. Pure functions of the run's tables, like charts.py.

A cluster's steps table holds every instance's steps, told apart by its instance column; the
Run page's other figures draw them together. Here each instance is its own line, so a router
that piles work on one instance shows as one line above the rest.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.charts import LAYOUT, series_color
from dashboard.downsample import MAX_POINTS, step_series


def instance_count(steps: pd.DataFrame) -> int:
    """How many instances a run's steps come from (1 for a run without the column)."""
    return int(steps["instance"].nunique()) if "instance" in steps.columns and not steps.empty else 1


def instance_labels(steps: pd.DataFrame) -> dict[int, str]:
    """instance -> its name in a legend: "instance 3", with its role where the run has one."""
    labels = {}
    for instance in sorted(int(i) for i in steps["instance"].unique()):
        label = f"instance {instance}"
        if "role" in steps.columns:
            roles = steps.loc[steps["instance"] == instance, "role"].astype(str).unique()
            if len(roles) == 1:
                label += f" ({roles[0]})"
        labels[instance] = label
    return labels


def instance_load_figure(steps: pd.DataFrame, kv_tokens: int | None) -> go.Figure:
    """Per instance over time: running requests, waiting requests, KV tokens held."""
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=("Running requests", "Waiting requests", "KV tokens used")
    )
    labels = instance_labels(steps)
    # Each instance gets its share of the points, so the whole figure stays as light as one series.
    per_instance = max(200, MAX_POINTS // max(1, len(labels)))
    for k, (instance, label) in enumerate(labels.items()):
        own = steps[steps["instance"] == instance]
        s = step_series(own, "schedule_start", {"num_running": "max", "num_waiting": "max", "kv_used_tokens": "max"}, per_instance)
        for row, col in enumerate(("num_running", "num_waiting", "kv_used_tokens"), start=1):
            fig.add_trace(
                go.Scatter(
                    x=s["time"],
                    y=s[col],
                    name=label,
                    legendgroup=label,
                    showlegend=row == 1,
                    line=dict(color=series_color(k), shape="hv"),
                ),
                row=row,
                col=1,
            )
    if kv_tokens:  # the pool of one instance: each has its own
        fig.add_hline(y=kv_tokens, line_dash="dot", line_color="gray", row=3, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="requests", row=1, col=1)
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_yaxes(title_text="tokens", row=3, col=1)
    fig.update_xaxes(title_text="time (s)", row=3, col=1)
    fig.update_layout(title="Load per instance", height=720, **LAYOUT)
    return fig


def routing_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per instance: requests sent there, their prompt tokens, the share of those the prefix
    cache served, output tokens, and the TTFT median (ms) of those that got a first token."""
    ttft = (requests["first_token"] - requests["arrival"]) * 1e3
    frame = pd.DataFrame(
        {
            "instance": requests["instance"].astype(int),
            "input_tokens": requests["input_tokens"],
            "cached_tokens": requests["cached_tokens"],
            "output_tokens": requests["output_tokens"],
            "ttft_ms": ttft,
        }
    )
    grouped = frame.groupby("instance")
    table = pd.DataFrame(
        {
            "requests": grouped.size(),
            "input_tokens": grouped["input_tokens"].sum(),
            "output_tokens": grouped["output_tokens"].sum(),
            "cache_hit_rate": grouped["cached_tokens"].sum() / grouped["input_tokens"].sum().replace(0, np.nan),
            "p50_ttft_ms": grouped["ttft_ms"].median(),
        }
    )
    table.index.name = "instance"
    return table


def routing_figure(requests: pd.DataFrame) -> go.Figure:
    """Where the requests went: requests and prompt tokens per instance, and each one's hit rate."""
    table = routing_table(requests)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    names = [str(i) for i in table.index]
    fig.add_trace(go.Bar(x=names, y=table["requests"], name="requests", marker_color=series_color(0)))
    fig.add_trace(
        go.Scatter(
            x=names, y=table["cache_hit_rate"], name="prefix cache hit rate", mode="markers", marker=dict(color=series_color(1), size=10)
        ),
        secondary_y=True,
    )
    fig.update_xaxes(title_text="instance", type="category")
    fig.update_yaxes(title_text="requests", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title_text="hit rate", tickformat=".0%", range=[0, 1.02], secondary_y=True)
    fig.update_layout(title="Where the router sent the requests", height=380, **LAYOUT)
    return fig
