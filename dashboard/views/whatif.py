"""What-if: one trace, several scheduler options; the simulations run here and land as run folders.

Below them a sweep opens (sweep_section): its points, a metric over its axes, the Pareto front.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard import cache, charts, sweep_section, ui
from dashboard.runs_index import DISPLAY_COLUMNS, ERROR_STATUS, HEADLINE_KEYS, index_row
from dashboard.settings import runs_dir
from dashboard.whatif import MAX_VARIANTS, WhatIfGrid, parse_values, run_variants, split_runnable, variants
from testbed.errors import USER_ERRORS
from testbed.options import POLICIES, SCHEDULERS, ReplayOptions, bundled_model_names
from testbed.replay_options import DEFAULT_HARDWARE, DEFAULT_MODEL

TRACE_PATTERNS = ("traces/*.json", "traces/*.jsonl", "traces/*.csv")
HARDWARE = ("h100", "h200", "a100", "cpu")
ROOFLINE = "roofline (no profile)"


def trace_choices(idx: pd.DataFrame) -> list[str]:
    """Traces in ./traces and every trace a run replayed that is still there."""
    found = [str(p) for pattern in TRACE_PATTERNS for p in sorted(Path().glob(pattern))]
    found += [t for t in idx["trace"].dropna().unique() if Path(t).is_file()]
    return list(dict.fromkeys(found))


class Progress:
    """st.progress for a batch of replays, redrawn at most every 0.2 s (one message per request is too many)."""

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels
        self.bar = st.progress(0.0, text="starting...")
        self.last = 0.0

    def __call__(self, i: int, n: int, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last < 0.2 and done < total:
            return
        self.last = now
        frac = (i + (done / total if total else 1.0)) / n
        self.bar.progress(min(frac, 1.0), text=f"run {i + 1} of {n} ({self.labels[i]}): {done:,} of {total:,} requests")


st.title("What-if")
st.caption(
    "Pick a trace and the values to try; every combination is simulated with the same scheduler code "
    f"and written as a run folder in `{runs_dir()}`."
)
idx = ui.index()
choices = trace_choices(idx)
c_trace, c_other = st.columns(2)
picked = c_trace.selectbox("Trace", choices, index=0 if choices else None, placeholder="no trace found in traces/")
other = c_other.text_input("or another trace file", placeholder="path/to/trace.jsonl")
trace = other.strip() or picked

st.subheader("Fixed")
c1, c2, c3, c4 = st.columns(4)
models = bundled_model_names()
model = c1.selectbox("Model", models, index=models.index(DEFAULT_MODEL), help="a profile runs the model it was calibrated for")
hardware = c2.selectbox("Hardware", HARDWARE, index=HARDWARE.index(DEFAULT_HARDWARE))
max_requests = c3.number_input("Max requests (0: all)", min_value=0, value=0, step=100)
seed = c4.number_input("Seed", value=0, step=1)

st.subheader("Varied (every combination runs)")
c1, c2, c3, c4 = st.columns(4)
policies = c1.multiselect("Policy", POLICIES, default=["fcfs"])
chunks_text = c2.text_input("Chunk size (tokens)", "8192", help="comma-separated; <= 0 disables chunked prefill")
kv_text = c3.text_input("KV tokens", "default", help="comma-separated; default: from the model and hardware")
overlap_names = c4.multiselect("Overlap", ["on", "off"], default=["on"])
c1, c2, c3, c4 = st.columns(4)
load_text = c1.text_input("Load scale", "1", help="comma-separated: 2 = twice the arrival rate")
page_text = c2.text_input("Page size", "1", help="comma-separated")
profile_files = [str(p) for p in sorted(Path("profiles").glob("*.json"))]
profile_names = c3.multiselect("Profile", [ROOFLINE, *profile_files], default=[ROOFLINE])
scheduler_names = c4.multiselect(
    "Scheduler",
    SCHEDULERS,
    default=["sglang"],
    help="SGLang's core or vLLM's; with vLLM's, the chunk size is its step token budget (max_num_batched_tokens)",
)

problems = []
try:
    grid = WhatIfGrid(
        policies=tuple(policies),
        schedulers=tuple(scheduler_names),
        chunk_sizes=parse_values(chunks_text, int, 8192),
        kv_tokens=parse_values(kv_text, int, None),
        overlaps=tuple(name == "on" for name in overlap_names),
        load_scales=parse_values(load_text, float, 1.0),
        page_sizes=parse_values(page_text, int, 1),
        profiles=tuple(None if p == ROOFLINE else p for p in profile_names),
    )
except ValueError as e:
    problems.append(str(e))
    grid = None
if grid is not None:
    for label, values in (
        ("policy", grid.policies),
        ("scheduler", grid.schedulers),
        ("overlap", grid.overlaps),
        ("profile", grid.profiles),
    ):
        if not values:
            problems.append(f"pick at least one {label}")
    if any(x <= 0 for x in grid.load_scales):
        problems.append("load scales must be positive")
    if any(x is not None and x <= 0 for x in grid.kv_tokens) or any(x <= 0 for x in grid.page_sizes):
        problems.append("KV tokens and page sizes must be positive")
if not trace:
    problems.append("pick a trace")
todo, skipped = [], []
if not problems:
    base = ReplayOptions(model=model, hardware=hardware, max_requests=int(max_requests) or None, seed=int(seed))
    try:
        todo, skipped = split_runnable(variants(base, grid))
    except USER_ERRORS as e:
        problems.append(str(e))
    if len(todo) > MAX_VARIANTS:
        problems.append(f"{len(todo)} combinations: at most {MAX_VARIANTS} run from this page")
    elif not todo and skipped:
        problems.append(f"no combination can run: {skipped[0][1]}")
for p in problems:
    st.error(p)
for variant, why in skipped:
    st.info(f"skipped {variant.label}: {why}")

if st.button(f"Run {len(todo)} simulation{'s' * (len(todo) != 1)}", type="primary", disabled=bool(problems)):
    runs_dir().mkdir(parents=True, exist_ok=True)
    results = run_variants(trace, todo, runs_dir(), Progress([v.label for v in todo]))
    st.session_state[ui.WHATIF_KEY] = [
        {"label": r.variant.label, "path": str(r.run_dir) if r.run_dir else None, "error": r.error} for r in results
    ]

results = st.session_state.get(ui.WHATIF_KEY)
if results:
    st.header("Results")
    for r in results:
        if r["error"]:
            st.error(f"{r['label']}: {r['error']}")
    done = [r for r in results if r["path"] and Path(r["path"]).is_dir()]
    if done:
        rows = pd.DataFrame([index_row(Path(r["path"]), runs_dir()) for r in done])
        rows.insert(0, "what-if", [r["label"] for r in done])
        # What a what-if is for first: the numbers; the options are in the label.
        table = rows[["what-if", "name", "status", *HEADLINE_KEYS]].rename(columns=DISPLAY_COLUMNS)
        st.dataframe(table, hide_index=True, column_config=ui.column_config())
        ok = rows[rows["status"] != ERROR_STATUS]
        st.plotly_chart(charts.latency_cdf_figure({label: cache.cdfs(p) for label, p in zip(ok["what-if"], ok["path"])}))
        st.plotly_chart(charts.percentile_bars_figure({label: cache.load(p).summary for label, p in zip(ok["what-if"], ok["path"])}))
        if len(ok) >= 2 and st.button("Open these in Compare"):
            st.session_state[ui.COMPARE_KEY] = list(ok["name"])
            st.switch_page("views/compare.py")

st.divider()
sweep_section.show(runs_dir())
