"""Compare: two or more runs overlaid, with the relative errors `testbed compare` prints.

The first run is the reference A; every other run B gets (B - A) / A. The case
this page is for: a real run as A and the simulation of the same trace as B.
"""

from __future__ import annotations

import streamlit as st

from dashboard import cache, charts, ui
from dashboard.compare_table import as_printed, compare_frame
from dashboard.runs_index import comparable_pair, loadable
from testbed.runs.by_arrival import by_arrival, format_by_arrival
from testbed.runs.cli import INTAKE_NOTE, format_compare
from testbed.runs.compare import compare_runs, differences, ttft_basis
from testbed.runs.folder import RunLoadError

st.title("Compare")
runs = loadable(ui.index())
if len(runs) < 2:
    st.info("Compare needs at least two runs.")
    if runs.empty:
        ui.no_runs_message()
    st.stop()
names = list(runs["name"])
# ?runs=A,B,... opens those runs (a link to a comparison); else the newest comparable real and sim pair.
linked = [n for n in st.query_params.get("runs", "").split(",") if n in names]
pair = comparable_pair(runs)
ui.keep_valid(ui.COMPARE_KEY, names, linked if len(linked) >= 2 else pair)
chosen = st.multiselect("Runs (the first is the reference A)", names, key=ui.COMPARE_KEY)
if len(chosen) < 2:
    st.info(
        "Pick two or more runs: a real run as A and a simulation of the same trace as B is what this page is for."
        + ("" if pair else " No two runs here replayed the same trace at the same load with the same model.")
    )
    st.stop()

loaded = {}
for name in chosen:
    try:
        loaded[name] = cache.load(runs.loc[runs["name"] == name, "path"].iloc[0])
    except (RunLoadError, OSError, ValueError) as e:
        st.error(f"{name} does not load: {e}")
if len(loaded) < 2:
    st.stop()
labels = list(loaded)
reference, others = loaded[labels[0]], [loaded[n] for n in labels[1:]]

for label, run in zip(labels[1:], others):
    diffs = differences(reference, run)
    if diffs:
        st.warning(f"**{label}** is not the same workload as **{labels[0]}**:\n" + "\n".join(f"- {d}" for d in diffs))

st.header("Relative error against A")
basis = ttft_basis(reference, *others)  # every run's TTFT from one start
intake = f" {INTAKE_NOTE}." if basis == "queued" else ""
st.caption(f"A = **{labels[0]}**; rel. err = (B - A) / A, as `testbed compare A B` prints it.{intake}")
table = as_printed(compare_frame(reference, others, labels), labels)
st.dataframe(table, hide_index=True, height="content")
with st.expander("As `testbed compare` prints it"):
    for run in others:
        st.code(format_compare(reference, run, compare_runs(reference, run), differences(reference, run)), language=None)

st.header("By arrival")
num_groups = st.number_input("Groups of consecutive arrivals", min_value=1, max_value=100, value=10, step=1)
groups = {label: by_arrival(reference, run, int(num_groups), basis) for label, run in zip(labels[1:], others)}
st.caption(
    f"The requests both runs finished, in A's arrival order, in {int(num_groups)} groups: where in the run "
    "B drifts from A (`testbed compare A B --by-arrival K`)."
)
st.plotly_chart(charts.arrival_error_figure(groups))
with st.expander("As `testbed compare --by-arrival` prints it"):
    for rows in groups.values():
        st.code(format_by_arrival(rows), language=None)

st.header("Latency")
paths = dict(zip(runs["name"], runs["path"]))
st.plotly_chart(charts.latency_cdf_figure({label: cache.cdfs(paths[label]) for label in labels}))
st.plotly_chart(charts.percentile_bars_figure({label: loaded[label].summary for label in labels}))
