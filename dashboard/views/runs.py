"""Runs: every run folder in a table; broken folders listed with their error."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.runs_index import ERROR_STATUS, display_frame, filter_runs, studies
from dashboard.settings import runs_dir

st.title("Runs")
st.caption(f"Run folders in `{runs_dir()}`. Click a column header to sort; select rows to open or compare them.")

idx = ui.index()
if idx.empty:
    ui.no_runs_message()
    st.stop()

# The points of sweeps and capacity searches are one row each below, unless asked for here.
grouped = studies(idx, runs_dir())
show_points = len(grouped) > 0 and st.toggle(
    f"List the points of the {len(grouped)} sweep(s) and capacity search(es) as runs",
    value=False,
    help="Each point of a sweep is a run folder; by default a sweep is one row in its own table below.",
)
listed = idx if show_points else idx[idx["study"].isna()]
for _, row in listed[listed["status"] == ERROR_STATUS].iterrows():
    st.error(f"**{row['name']}** does not load: {row['error']}")
unfinished = listed[~listed["status"].isin(["complete", ERROR_STATUS])]
if len(unfinished):
    names = ", ".join(f"{n} ({s})" for n, s in zip(unfinished["name"], unfinished["status"]))
    st.warning(f"Not complete: {names}. Their numbers cover only the requests they got to.")

c_text, c_mode, c_policy, c_status = st.columns([3, 1, 2, 2])
text = c_text.text_input("Filter", placeholder="name, trace, model, hardware, policy...")
modes = c_mode.multiselect("Mode", sorted(idx["mode"].dropna().unique()))
policies = c_policy.multiselect("Policy", sorted(idx["policy"].dropna().unique()))
statuses = c_status.multiselect("Status", sorted(idx["status"].dropna().unique()))
shown = filter_runs(listed, text, mode=modes, policy=policies, status=statuses).reset_index(drop=True)

event = st.dataframe(
    display_frame(shown),
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="multi-row",
    key="runs_table",
    column_config=ui.column_config(),
)
st.caption(f"{len(shown)} of {len(listed)} runs" + ("" if show_points else f", and {len(idx) - len(listed)} points of the studies below"))

selected = shown.iloc[event.selection.rows] if event is not None else shown.iloc[[]]
selected = selected[selected["status"] != ERROR_STATUS]
c_open, c_compare, _ = st.columns([1, 1, 4])
if c_open.button("Open in Run", disabled=len(selected) != 1):
    st.session_state[ui.RUN_KEY] = selected["name"].iloc[0]
    st.switch_page("views/run.py")
if c_compare.button("Compare selected", disabled=len(selected) < 2):
    st.session_state[ui.COMPARE_KEY] = list(selected["name"])
    st.switch_page("views/compare.py")

if len(grouped) and not show_points:
    st.subheader("Sweeps and capacity searches")
    st.dataframe(
        grouped,
        hide_index=True,
        width="stretch",
        column_config={"date (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss")},
    )
    st.caption("Open one on the What-if page (Open a sweep) for its table, charts and Pareto front.")
