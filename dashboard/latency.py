"""Per-request latency samples, by the definitions of testbed.runs.metrics.summarize.

The summary in run.json keeps only mean and percentiles; the CDFs need every
sample. Same definitions, so the percentiles of these arrays are run.json's
(tests check it): TTFT, E2E per finished request, TPOT per finished request
with more than one output token, ITL every gap between consecutive tokens.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dashboard.downsample import cdf_points
from testbed.runs.metrics import LATENCIES

LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}


def latencies_ms(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    """{"ttft", "tpot", "itl", "e2e"} -> samples in milliseconds (empty arrays for an empty run)."""
    if requests.empty:
        return {name: np.empty(0) for name in LATENCIES}
    done = requests[requests["status"] == "finished"]
    multi = done[done["output_tokens"] > 1]
    gaps = [np.diff(tt) for tt in done["token_times"] if len(tt) > 1]
    seconds = {
        "ttft": (done["first_token"] - done["arrival"]).to_numpy(),
        "tpot": ((multi["finish"] - multi["first_token"]) / (multi["output_tokens"] - 1)).to_numpy(),
        "itl": np.concatenate(gaps) if gaps else np.empty(0),
        "e2e": (done["finish"] - done["arrival"]).to_numpy(),
    }
    return {name: np.asarray(seconds[name], dtype=np.float64) * 1000.0 for name in LATENCIES}


def latency_cdfs(requests: pd.DataFrame) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{latency: (x in ms, P[X <= x])}, at most downsample.MAX_POINTS points each: what a CDF plot draws."""
    return {name: cdf_points(values) for name, values in latencies_ms(requests).items()}
