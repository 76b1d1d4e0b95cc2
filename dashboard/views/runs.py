"""Runs: every run folder in a table; broken folders listed with their error."""

from __future__ import annotations

import streamlit as st

from dashboard import ui
from dashboard.runs_index import ERROR_STATUS, display_frame, filter_runs
from dashboard.settings import runs_dir

st.title("Runs")
st.caption(f"Run folders in `{runs_dir()}`. Click a column header to sort; select rows to open or compare them.")

idx = ui.index()
if idx.empty:
    ui.no_runs_message()
    st.stop()

for _, row in idx[idx["status"] == ERROR_STATUS].iterrows():
    st.error(f"**{row['name']}** does not load: {row['error']}")
unfinished = idx[~idx["status"].isin(["complete", ERROR_STATUS])]
if len(unfinished):
    names = ", ".join(f"{n} ({s})" for n, s in zip(unfinished["name"], unfinished["status"]))
    st.warning(f"Not complete: {names}. Their numbers cover only the requests they got to.")

c_text, c_mode, c_policy, c_status = st.columns([3, 1, 2, 2])
text = c_text.text_input("Filter", placeholder="name, trace, model, hardware, policy...")
modes = c_mode.multiselect("Mode", sorted(idx["mode"].dropna().unique()))
policies = c_policy.multiselect("Policy", sorted(idx["policy"].dropna().unique()))
statuses = c_status.multiselect("Status", sorted(idx["status"].dropna().unique()))
shown = filter_runs(idx, text, mode=modes, policy=policies, status=statuses).reset_index(drop=True)

event = st.dataframe(
    display_frame(shown),
    hide_index=True,
    width="stretch",
    on_select="rerun",
    selection_mode="multi-row",
    key="runs_table",
    column_config=ui.column_config(),
)
st.caption(f"{len(shown)} of {len(idx)} runs")

selected = shown.iloc[event.selection.rows] if event is not None else shown.iloc[[]]
selected = selected[selected["status"] != ERROR_STATUS]
c_open, c_compare, _ = st.columns([1, 1, 4])
if c_open.button("Open in Run", disabled=len(selected) != 1):
    st.session_state[ui.RUN_KEY] = selected["name"].iloc[0]
    st.switch_page("views/run.py")
if c_compare.button("Compare selected", disabled=len(selected) < 2):
    st.session_state[ui.COMPARE_KEY] = list(selected["name"])
    st.switch_page("views/compare.py")
