"""The relative-error table of `testbed compare`, for a reference run and one or more others."""

from __future__ import annotations

import pandas as pd

from dashboard.latency import LABELS
from testbed.runs.cli import OTHER_LABELS, fmt_metric, fmt_rel_err
from testbed.runs.compare import METRIC_KEYS, STATS, compare_runs, ttft_basis
from testbed.runs.folder import Run
from testbed.runs.metrics import LATENCIES

METRIC_LABELS = {f"{s}_{m}_ms": f"{LABELS[m]} {s} (ms)" for m in LATENCIES for s in STATS} | OTHER_LABELS


def rel_err_column(label: str) -> str:
    return f"rel. err {label}"


def compare_frame(reference: Run, others: list[Run], labels: list[str]) -> pd.DataFrame:
    """One row per metric of testbed.runs.compare.METRIC_KEYS: the reference's value, then each other
    run's value and its relative error (B - A) / A as `testbed compare` prints it ("+3.2%").
    labels: the reference's, then the others'. TTFT and E2E of every run from one start (ttft_basis)."""
    out = pd.DataFrame({"metric": [METRIC_LABELS[k] for k in METRIC_KEYS]}, index=list(METRIC_KEYS))
    basis = ttft_basis(reference, *others)
    for i, (run, label) in enumerate(zip(others, labels[1:])):
        rows = compare_runs(reference, run, basis)
        if i == 0:
            out[labels[0]] = [r.a for r in rows]
        out[label] = [r.b for r in rows]
        out[rel_err_column(label)] = [fmt_rel_err(r.rel_err) for r in rows]
    return out


def as_printed(table: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """compare_frame with each run's values as `testbed compare` prints them: thousands
    separators, the cache hit rate in percent (one column holds metrics of every kind)."""
    shown = table.copy()
    for label in labels:
        shown[label] = [_as_printed(key, v) for key, v in zip(table.index, table[label])]
    return shown


def _as_printed(key: str, v) -> str:
    if v is None or pd.isna(v):
        return fmt_metric(None)
    if key == "completed":  # a count (the column made it a float)
        return fmt_metric(int(v))
    return fmt_metric(float(v), percent=key == "cache_hit_rate")
