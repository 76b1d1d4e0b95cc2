"""Streamlit pieces the pages share: the runs index, run pickers, the run's one-line description."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd
import streamlit as st

from dashboard.runs_index import scan_runs
from dashboard.settings import runs_dir
from testbed.runs.folder import RUN_FILE

# Selections that outlive a page switch (see app.py).
RUN_KEY = "run"  # the Run page's run
COMPARE_KEY = "compare"  # the Compare page's runs
WHATIF_KEY = "whatif_results"  # the What-if page's last batch
PERSISTENT_KEYS = (RUN_KEY, COMPARE_KEY)


# Numbers as the CLI prints them: thousands separators (1,654.40), rates in percent.
MS, RATE, COUNT, PERCENT = "%,.2f", "%,.0f", "%,d", "percent"


def column_config() -> dict:
    """How the Runs table's columns (runs_index.DISPLAY_COLUMNS headers) are formatted."""
    number = st.column_config.NumberColumn
    return {
        "date (UTC)": st.column_config.DatetimeColumn(format="YYYY-MM-DD HH:mm:ss"),
        "completed": number(format=COUNT),
        "KV tokens": number(format=COUNT),
        "TTFT mean (ms)": number(format=MS),
        "TTFT p99 (ms)": number(format=MS),
        "TPOT mean (ms)": number(format=MS),
        "TPOT p99 (ms)": number(format=MS),
        "req/s": number(format=MS),
        "output tok/s": number(format=RATE),
        "cache hit rate": number(format=PERCENT),
    }


def index(extra: Sequence[Path] = ()) -> pd.DataFrame:
    """The runs index, scanned on every rerun: it reads only run.json files, and a run that
    appears (a replay, a What-if) shows up at once. `extra`: run folders outside the runs dir."""
    return scan_runs(runs_dir(), extra)


def linked_outside_run(linked: str | None) -> list[Path]:
    """The run folder a ?run= link names by its absolute path (a point of a sweep kept outside
    the runs dir, see sweep_view.run_name), if it is one; else nothing."""
    if not linked or not Path(linked).is_absolute() or not (Path(linked) / RUN_FILE).is_file():
        return []
    return [Path(linked)]


def no_runs_message() -> None:
    st.info(f"No run folders in `{runs_dir()}` yet. Make some with `testbed replay TRACE --out {runs_dir()}/NAME`, or on the What-if page.")


def keep_valid(key: str, options: list[str], default: str | list[str]) -> None:
    """Give a run picker its default on the first visit, and drop runs that are gone since (deleted folders)."""
    if key not in st.session_state:
        st.session_state[key] = default
        return
    value = st.session_state[key]
    if isinstance(value, list):
        valid = [v for v in value if v in options]
        if valid != value:
            st.session_state[key] = valid
    elif value not in options:
        st.session_state[key] = default


def on_off(flag) -> str:
    return "?" if pd.isna(flag) else ("on" if flag else "off")


def describe(row: pd.Series) -> str:
    """trace, mode, model on hardware, policy and the options that matter, in one line."""
    overlap = on_off(row["overlap"])
    parts = [
        f"trace `{row['trace']}`",
        str(row["mode"]),
        f"{row['model']} on {row['hardware']}",
        f"policy {row['policy']}",
        f"overlap {overlap}",
        f"chunk {row['chunked_prefill_size']}",
        f"page {row['page_size']}",
    ]
    if pd.notna(row["kv_tokens"]):
        parts.append(f"KV {int(row['kv_tokens']):,} tokens")
    if row["time_scale"] not in (None, 1.0) and pd.notna(row["time_scale"]):
        parts.append(f"time scale {row['time_scale']:g}")
    if pd.notna(row["profile"]) and row["profile"]:
        parts.append(f"profile {row['profile']}")
    return " · ".join(parts)
