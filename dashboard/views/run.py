"""Run: one run in depth: latencies, throughput and queues, batches, KV, retractions, the step timeline."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import cache, charts, cluster_charts, timeline, ui
from dashboard.latency import LABELS
from dashboard.runs_index import loadable
from testbed.runs.compare import STATS
from testbed.runs.folder import RunLoadError
from testbed.runs.metrics import LATENCIES

WINDOW_SIZES = (20, 50, 100, 200, 500)  # steps on the timeline; bars, so a few hundred at most

st.title("Run")
# ?run=NAME opens that run (a link to it); else the newest. NAME is its name in the runs
# index, or the absolute path of a run folder elsewhere (a sweep's point, linked from What-if).
linked = st.query_params.get("run")
runs = loadable(ui.index(ui.linked_outside_run(linked)))
if runs.empty:
    ui.no_runs_message()
    st.stop()
names = list(runs["name"])
ui.keep_valid(ui.RUN_KEY, names, linked if linked in names else names[0])
status_of = dict(zip(runs["name"], runs["status"]))
name = st.selectbox("Run", names, key=ui.RUN_KEY, format_func=lambda n: n if status_of[n] == "complete" else f"{n} ({status_of[n]})")
row = runs[runs["name"] == name].iloc[0]
st.markdown(ui.describe(row))
try:
    run = cache.load(row["path"])
except (RunLoadError, OSError, ValueError) as e:  # ValueError: a parquet file pyarrow cannot read
    st.error(f"{name} does not load: {e}")
    st.stop()
if run.status != "complete":
    st.warning(f"This run is **{run.status}**: the numbers cover only the requests it got to. {run.meta.get('error') or ''}")

s = run.summary
cols = st.columns(6)
cols[0].metric("completed", f"{s.get('completed', 0):,}", help=f"rejected {s.get('rejected', 0)}, unfinished {s.get('unfinished', 0)}")
cols[1].metric("duration (s)", f"{s.get('duration_s', 0):.2f}")
cols[2].metric("requests/s", f"{s.get('request_throughput', 0):.2f}")
cols[3].metric("output tokens/s", f"{s.get('output_throughput', 0):,.0f}")
hit = s.get("cache_hit_rate")  # None: not known (an imported run)
cols[4].metric("cache hit rate", "-" if hit is None else f"{hit * 100:.1f}%")
cols[5].metric("retractions", f"{s.get('num_retractions', 0):,}")

st.header("Latency")
percentiles = pd.DataFrame(
    {stat: [s.get(f"{stat}_{m}_ms") for m in LATENCIES] for stat in STATS},
    index=pd.Index([f"{LABELS[m]} (ms)" for m in LATENCIES], name="latency"),
)
st.dataframe(percentiles, column_config={stat: st.column_config.NumberColumn(format=ui.MS) for stat in STATS})
figures = cache.run_figures(row["path"], name)
st.plotly_chart(figures["latency"])

st.header("Over time")
steps = run.steps
if steps.empty:
    imported = run.meta.get("mode") == "imported"
    st.info("Imported from another engine: its steps are not known." if imported else "This run has no steps.")
    st.stop()
if "instances" in figures:
    st.caption("All instances together; each one apart under Instances below.")
st.plotly_chart(figures["throughput"])
st.plotly_chart(figures["batch"])
st.plotly_chart(figures["kv"])
if s.get("num_retractions", 0):
    st.plotly_chart(figures["retractions"])
else:  # nothing to draw
    st.caption("No request was retracted: the KV pool never ran out.")

if "instances" in figures:
    st.header("Instances")
    cluster = run.meta.get("cluster") or {}
    imbalance = s.get("load_imbalance")
    st.markdown(
        f"{cluster_charts.instance_count(steps)} instances behind the **{cluster.get('router', '?')}** router"
        + (f"; load imbalance {imbalance:.2f} (the busiest instance's requests over the mean)" if imbalance is not None else "")
    )
    st.plotly_chart(figures["instances"])
    st.plotly_chart(figures["routing"])
    st.dataframe(
        cluster_charts.routing_table(run.requests),
        column_config={
            "cache_hit_rate": st.column_config.NumberColumn("cache hit rate", format="percent"),
            "p50_ttft_ms": st.column_config.NumberColumn("TTFT p50 (ms)", format=ui.MS),
        },
    )


@st.fragment  # moving the window reruns only this part, not the whole page
def step_timeline() -> None:
    st.header("Step timeline")
    steps = run.steps
    if "instances" in figures:  # each instance has its own CPU and device: one at a time
        instance = st.selectbox("Instance", sorted(int(i) for i in steps["instance"].unique()))
        steps = steps[steps["instance"] == instance].reset_index(drop=True)
    ov = timeline.overlap_stats(steps)
    st.caption(
        f"Overlap {ui.on_off(row['overlap'])}: the device was busy {ov.device_busy_fraction:.1%} of the run, "
        f"and {ov.cpu_hidden_fraction:.1%} of the CPU's scheduling and result processing ran while it was."
    )
    c_size, c_first = st.columns([1, 4])
    size = c_size.selectbox("Steps shown", WINDOW_SIZES, index=0)
    n = len(steps)
    first = c_first.slider("First step", 1, max(1, n - size + 1), 1) if n > size else 1
    window = steps.iloc[first - 1 : first - 1 + size]
    st.plotly_chart(charts.timeline_figure(timeline.intervals(window)))
    st.download_button(
        "Download the timeline (Chrome/Perfetto trace JSON)",
        data=lambda: timeline.trace_json(steps, name),  # built on click: a whole Mooncake run is ~100 MB
        file_name=f"{name.replace('/', '_')}.trace.json",
        mime="application/json",
        on_click="ignore",
        help=f"All {n:,} steps; open it in ui.perfetto.dev or chrome://tracing",
    )


step_timeline()
