"""Few enough points to plot: a whole Mooncake run has ~143k steps and millions of token gaps.

Time series are cut into equal time bins and each column is aggregated its own
way (max keeps a queue's peaks, mean keeps tokens per step, sum keeps counts);
a run short enough is plotted step by step. A CDF is drawn through samples
evenly spaced in rank, each at its exact empirical probability.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MAX_POINTS = 2000  # per series; a browser draws this many without lag


def time_bins(t: np.ndarray, max_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """(bin index of each t, bin left edges) for at most max_bins equal-width bins over t's range."""
    t = np.asarray(t, dtype=np.float64)
    if len(t) == 0:
        return np.empty(0, dtype=np.int64), np.empty(0)
    lo, hi = float(np.min(t)), float(np.max(t))
    n = max(1, int(max_bins))
    width = (hi - lo) / n if hi > lo else 1.0
    idx = np.minimum(((t - lo) / width).astype(np.int64), n - 1)
    return idx, lo + width * np.arange(n)


def step_series(df: pd.DataFrame, time_col: str, agg: dict[str, str], max_points: int = MAX_POINTS) -> pd.DataFrame:
    """Columns of agg over time: the rows themselves if there are at most max_points,
    else one row per non-empty time bin, column c aggregated by agg[c] ("max", "mean", "sum").
    The result has a "time" column (the bin's left edge) and the agg columns."""
    if len(df) <= max_points:
        out = df[list(agg)].copy()
        out.insert(0, "time", df[time_col].to_numpy())
        return out.reset_index(drop=True)
    idx, edges = time_bins(df[time_col].to_numpy(), max_points)
    grouped = df[list(agg)].groupby(idx).agg(agg)
    grouped.insert(0, "time", edges[grouped.index.to_numpy()])
    return grouped.reset_index(drop=True)


def peak_rows(df: pd.DataFrame, time_col: str, columns: list[str], max_points: int = MAX_POINTS) -> pd.DataFrame:
    """Columns that stack (parts of one whole, like the KV pool's used and evictable tokens) over
    time: the rows themselves if there are at most max_points, else in each time bin the one row
    where their sum peaks. Each column's own maximum would come from different steps, and
    stacked they would show more than any step held. Columns "time" (the bin's left edge) and columns."""
    if len(df) <= max_points:
        out = df[columns].copy()
        out.insert(0, "time", df[time_col].to_numpy())
        return out.reset_index(drop=True)
    idx, edges = time_bins(df[time_col].to_numpy(), max_points)
    total = df[columns].to_numpy(dtype=np.float64).sum(axis=1)
    order = np.lexsort((-total, idx))  # by bin, the largest sum first
    first = order[np.r_[True, idx[order][1:] != idx[order][:-1]]]
    out = df[columns].iloc[first].reset_index(drop=True)
    out.insert(0, "time", edges[idx[first]])
    return out


def rate_series(times: np.ndarray, bins: int = 200, weights: np.ndarray | None = None) -> pd.DataFrame:
    """Events per second over time (e.g. token times -> tokens/s): columns time (bin start), rate."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) == 0:
        return pd.DataFrame({"time": [], "rate": []})
    lo, hi = float(times.min()), float(times.max())
    n = max(1, int(bins))
    counts, edges = np.histogram(times, bins=n, range=(lo, hi if hi > lo else lo + 1.0), weights=weights)
    width = edges[1] - edges[0]
    return pd.DataFrame({"time": edges[:-1], "rate": counts / width})


def cdf_points(values: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(x, P[X <= x]) of the empirical CDF at every sample, or at max_points samples evenly spaced in rank."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return v, v.copy()
    idx = np.unique(np.linspace(0, len(v) - 1, min(len(v), max_points)).round().astype(np.int64))
    x = v[idx]
    # side="right" counts ties, so each point lies exactly on the empirical CDF.
    return x, np.searchsorted(v, x, side="right") / len(v)
