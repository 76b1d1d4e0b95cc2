"""The dashboard's entry point: `testbed dashboard` runs `streamlit run dashboard/app.py -- --runs DIR`.

Four pages (views/): Runs, Run, Compare, What-if. This script runs before the
page on every rerun.
"""

from __future__ import annotations

import streamlit as st

from dashboard import ui

st.set_page_config(page_title="testbed dashboard", layout="wide")

# Streamlit forgets a widget's value when a page without that widget runs; writing
# the value back keeps the chosen run(s) when the user comes back to the page.
for key in ui.PERSISTENT_KEYS:
    if key in st.session_state:
        st.session_state[key] = st.session_state[key]

page = st.navigation(
    [
        st.Page("views/runs.py", title="Runs", icon=":material/table:", default=True),
        st.Page("views/run.py", title="Run", icon=":material/monitoring:"),
        st.Page("views/compare.py", title="Compare", icon=":material/compare_arrows:"),
        st.Page("views/whatif.py", title="What-if", icon=":material/science:"),
    ]
)
page.run()
