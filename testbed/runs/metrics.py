"""Per-request table and the run summary, as serving benchmarks define them.

TTFT: first token - arrival. TPOT: (finish - first token) / (output tokens - 1),
per request with more than one output token. ITL: every gap between two
consecutive tokens of a request. E2E: finish - arrival.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from scheduler.req import FinishReason, Req

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")


def status_of(req: Req) -> str:
    if req.finished_reason == FinishReason.REJECTED:
        return "rejected"
    return "finished" if req.finished() else "unfinished"


# The columns of requests_frame, as a run's requests journal holds them (testbed.runs.writer).
REQUESTS_SCHEMA = pa.schema(
    [("rid", pa.string()), ("index", pa.int64())]
    + [(c, pa.float64()) for c in ("arrival", "scheduled", "first_token", "finish")]
    + [(c, pa.int64()) for c in ("input_tokens", "output_tokens", "max_new_tokens", "cached_tokens", "prefill_tokens", "num_retractions", "priority")]
    + [("status", pa.string()), ("reason", pa.string()), ("token_times", pa.list_(pa.float64()))]
)


def requests_frame(reqs: Iterable[Req]) -> pd.DataFrame:
    """One row per request, in trace order."""
    return pd.DataFrame(requests_columns(sorted(reqs, key=lambda r: r.index)))


def requests_columns(rows: Sequence[Req]) -> dict[str, Any]:
    """The columns of requests_frame, rows in the order given (numpy arrays and lists)."""
    nan = float("nan")

    def t(x: float | None) -> float:
        return nan if x is None else x

    return {
        "rid": [r.rid for r in rows],
        "index": np.array([r.index for r in rows], dtype=np.int64),
        "arrival": np.array([r.arrival_time for r in rows], dtype=np.float64),
        "scheduled": np.array([t(r.scheduled_time) for r in rows], dtype=np.float64),
        "first_token": np.array([t(r.first_token_time) for r in rows], dtype=np.float64),
        "finish": np.array([t(r.finish_time) for r in rows], dtype=np.float64),
        "input_tokens": np.array([r.input_len for r in rows], dtype=np.int64),
        "output_tokens": np.array([len(r.output_ids) for r in rows], dtype=np.int64),
        "max_new_tokens": np.array([r.max_new_tokens for r in rows], dtype=np.int64),
        "cached_tokens": np.array([r.cached_tokens for r in rows], dtype=np.int64),
        "prefill_tokens": np.array([r.prefill_tokens for r in rows], dtype=np.int64),
        "num_retractions": np.array([r.num_retractions for r in rows], dtype=np.int64),
        "priority": np.array([r.priority for r in rows], dtype=np.int64),
        "status": [status_of(r) for r in rows],
        "reason": [r.reject_reason or r.truncate_reason or (r.finished_reason.value if r.finished_reason else "") for r in rows],
        "token_times": [np.frombuffer(r.token_times, dtype=np.float64) if len(r.token_times) else np.empty(0) for r in rows],
    }


def _stats(name: str, values_s: np.ndarray, out: dict) -> None:
    ms = values_s * 1000.0
    if len(ms) == 0:
        out[f"mean_{name}_ms"] = None
        for p in PERCENTILES:
            out[f"p{p}_{name}_ms"] = None
        return
    out[f"mean_{name}_ms"] = float(np.mean(ms))
    for p, v in zip(PERCENTILES, np.percentile(ms, PERCENTILES)):
        out[f"p{p}_{name}_ms"] = float(v)


def summarize(df: pd.DataFrame) -> dict:
    """The summary keys of run.json (completed, duration_s, throughputs, latency stats, cache_hit_rate)."""
    done = df[df["status"] == "finished"]
    out: dict = {
        "completed": int(len(done)),
        "rejected": int((df["status"] == "rejected").sum()),
        "unfinished": int((df["status"] == "unfinished").sum()),
        # Outputs cut at admission to fit the context or the KV pool (SGLang's rule).
        "truncated": int(df["reason"].str.startswith("output truncated").sum()),
    }
    if len(done):
        duration = float(done["finish"].max() - df["arrival"].min())
    else:
        duration = 0.0
    out["duration_s"] = duration
    out["total_input_tokens"] = int(done["input_tokens"].sum())
    out["total_output_tokens"] = int(done["output_tokens"].sum())
    out["request_throughput"] = len(done) / duration if duration > 0 else 0.0
    out["input_throughput"] = out["total_input_tokens"] / duration if duration > 0 else 0.0
    out["output_throughput"] = out["total_output_tokens"] / duration if duration > 0 else 0.0

    ttft = (done["first_token"] - done["arrival"]).to_numpy()
    e2e = (done["finish"] - done["arrival"]).to_numpy()
    multi = done[done["output_tokens"] > 1]
    tpot = ((multi["finish"] - multi["first_token"]) / (multi["output_tokens"] - 1)).to_numpy()
    # Every request's gaps, in request order: the differences of all token times laid end to
    # end, less those across two requests (one np.diff, not one a request).
    times = [tt for tt in done["token_times"] if len(tt) > 1]
    if times:
        across = np.cumsum([len(tt) for tt in times])[:-1] - 1
        itl = np.delete(np.diff(np.concatenate(times)), across)
    else:
        itl = np.empty(0)
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        _stats(name, values, out)

    prefill = int(df["prefill_tokens"].sum())
    out["cache_hit_rate"] = float(df["cached_tokens"].sum() / prefill) if prefill else 0.0
    out["num_retractions"] = int(df["num_retractions"].sum())
    return out


def rejection_reason(reason: str) -> str:
    """A reject reason without the request's own lengths: "exceed the context length 8192",
    "leave no room for output: prompts must be under 4090 tokens (...)"."""
    return re.sub(r"^input \d+ (\+ output \d+ )?tokens ", "", reason)


def rejection_counts(requests: pd.DataFrame) -> dict[str, int]:
    """How many requests were rejected for each reason, most frequent first."""
    reasons = requests.loc[requests["status"] == "rejected", "reason"].map(rejection_reason)
    return {str(k): int(v) for k, v in reasons.value_counts().items()}


def run_summary(requests: pd.DataFrame, num_steps: int, simulated_s: float, kv_tokens: int | None) -> dict:
    """run.json's summary: summarize() and what the run itself knows."""
    return summarize(requests) | {"num_steps": num_steps, "simulated_s": simulated_s, "kv_tokens": kv_tokens}
