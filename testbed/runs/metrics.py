"""Per-request table and the run summary, as serving benchmarks define them.

TTFT: first token - arrival. TPOT: (finish - first token) / (output tokens - 1),
per request with more than one output token. ITL: every gap between two
consecutive tokens of a request. E2E: finish - arrival.

A run imported from timestamps that an engine stamps itself (vLLM's engine core: queued_ts, when it
read the request in between two steps) measures TTFT and E2E from that intake, not from the
request's arrival; its run.json says so (`ttft_from: "queued"`), and a run compared with it is
measured the same way (testbed/runs/compare.py, summary_from), from its `queued` column: when its scheduler took
each request in.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from scheduler.core.req import FinishReason, Req

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")


def status_of(req: Req) -> str:
    if req.finished_reason == FinishReason.REJECTED:
        return "rejected"
    return "finished" if req.finished() else "unfinished"


# The columns of requests_frame, as a run's requests journal holds them (testbed.runs.writer).
REQUESTS_SCHEMA = pa.schema(
    [("rid", pa.string()), ("index", pa.int64())]
    + [(c, pa.float64()) for c in ("arrival", "queued", "scheduled", "first_token", "finish")]
    + [
        (c, pa.int64())
        for c in (
            "input_tokens",
            "output_tokens",
            "max_new_tokens",
            "cached_tokens",
            "prefill_tokens",
            "num_retractions",
            "priority",
            "instance",
        )
    ]
    + [("status", pa.string()), ("reason", pa.string()), ("token_times", pa.list_(pa.float64()))]
)


# The columns a PD run's requests table adds (testbed/pd_replay.py): the decode instance, when the
# KV transfer started (the prefill was processed) and how long it took, how long the decode
# instance held the request back for KV before reserving it.
PD_REQUESTS_FIELDS = [
    pa.field("decode_instance", pa.int64()),
    pa.field("kv_transfer_start", pa.float64()),
    pa.field("kv_transfer_s", pa.float64()),
    pa.field("decode_held_s", pa.float64()),
]


def requests_schema(columns: Mapping[str, Any]) -> pa.Schema:
    """The schema of a requests table with these columns: REQUESTS_SCHEMA, and a PD run's own."""
    extra = [f for f in PD_REQUESTS_FIELDS if f.name in columns]
    return pa.schema(list(REQUESTS_SCHEMA) + extra) if extra else REQUESTS_SCHEMA


def requests_frame(reqs: Iterable[Req]) -> pd.DataFrame:
    """One row per request, in trace order."""
    return pd.DataFrame(requests_table(reqs))


def requests_table(reqs: Iterable[Req]) -> dict[str, Any]:
    """requests_frame's columns (numpy arrays and lists), without the DataFrame: what a replay
    writes and summarizes (summarize, rejection_counts and write_requests take either)."""
    return requests_columns(sorted(reqs, key=lambda r: r.index))


def requests_columns(rows: Sequence[Req]) -> dict[str, Any]:
    """The columns of requests_frame, rows in the order given (numpy arrays and lists)."""
    nan = float("nan")

    def t(x: float | None) -> float:
        return nan if x is None else x

    return {
        "rid": [r.rid for r in rows],
        "index": np.array([r.index for r in rows], dtype=np.int64),
        "arrival": np.array([r.arrival_time for r in rows], dtype=np.float64),
        "queued": np.array([t(r.queued_time) for r in rows], dtype=np.float64),
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
        "instance": np.array([r.instance for r in rows], dtype=np.int64),
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
    out[f"mean_{name}_ms"] = float(np.mean(ms))  # (before the percentiles reorder ms)
    # In place: ms is this function's own copy (the ITL has a value per token).
    for p, v in zip(PERCENTILES, np.percentile(ms, PERCENTILES, overwrite_input=True)):
        out[f"p{p}_{name}_ms"] = float(v)


def _gaps(token_times: list[np.ndarray]) -> np.ndarray:
    """Every gap between two consecutive tokens of each request, in request order, written
    into one array (laying the token times end to end, diffing and cutting them made three
    arrays of a value per token)."""
    out = np.empty(sum(len(tt) for tt in token_times) - len(token_times))
    at = 0
    for tt in token_times:
        n = len(tt) - 1
        np.subtract(tt[1:], tt[:-1], out=out[at : at + n])
        at += n
    return out


def ttft_start(requests: Mapping[str, Any], ttft_from: str = "arrival") -> np.ndarray:
    """Each request's start of TTFT and E2E: its arrival, or with ttft_from "queued" its `queued`
    column where it has one (else its arrival)."""
    arrival = np.asarray(requests["arrival"], dtype=np.float64)
    if ttft_from != "queued":
        return arrival
    queued = np.asarray(requests["queued"], dtype=np.float64)
    return np.where(np.isnan(queued), arrival, queued)


def tpot_per_request(first_token: np.ndarray, finish: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Each request's TPOT, (finish - first token) / (output tokens - 1); NaN for one with a single token."""
    return np.divide(finish - first_token, output_tokens - 1, out=np.full(len(finish), np.nan), where=output_tokens > 1)


def summarize(requests: Mapping[str, Any], ttft_from: str = "arrival") -> dict:
    """The summary keys of run.json (completed, duration_s, throughputs, latency stats,
    cache_hit_rate), from requests_frame's columns: the frame, or requests_table's dict (numpy
    on the columns, so both give the same floats). ttft_from "queued": TTFT and E2E from each
    request's `queued` column (where it has one; else its arrival)."""

    def col(name: str, dtype=np.float64) -> np.ndarray:
        return np.asarray(requests[name], dtype=dtype)

    status = col("status", object)
    done = status == "finished"
    out: dict = {
        "completed": int(done.sum()),
        "rejected": int((status == "rejected").sum()),
        "unfinished": int((status == "unfinished").sum()),
        # Outputs cut at admission to fit the context or the KV pool (SGLang's rule).
        "truncated": sum(1 for reason in requests["reason"] if reason.startswith("output truncated")),
        # Requests that failed on the way (a live server's error, a reset, a timeout; an imported
        # run's failures): unfinished, with the reason "failed: ...".
        "failed": sum(1 for reason in requests["reason"] if reason.startswith(FAILED)),
    }
    first_token, finish = col("first_token")[done], col("finish")[done]
    input_tokens, output_tokens = col("input_tokens", np.int64)[done], col("output_tokens", np.int64)[done]
    duration = float(finish.max() - col("arrival").min()) if len(finish) else 0.0
    out["duration_s"] = duration
    out["total_input_tokens"] = int(input_tokens.sum())
    out["total_output_tokens"] = int(output_tokens.sum())
    out["request_throughput"] = len(finish) / duration if duration > 0 else 0.0
    out["input_throughput"] = out["total_input_tokens"] / duration if duration > 0 else 0.0
    out["output_throughput"] = out["total_output_tokens"] / duration if duration > 0 else 0.0

    start = ttft_start(requests, ttft_from)[done]
    ttft = first_token - start
    e2e = finish - start
    multi = output_tokens > 1
    tpot = tpot_per_request(first_token, finish, output_tokens)[multi]
    itl = _gaps([tt for tt, d in zip(requests["token_times"], done) if d and len(tt) > 1])
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        _stats(name, values, out)

    prefill = int(col("prefill_tokens", np.int64).sum())
    out["cache_hit_rate"] = float(col("cached_tokens", np.int64).sum() / prefill) if prefill else 0.0
    out["num_retractions"] = int(col("num_retractions", np.int64).sum())
    return out


FAILED = "failed: "  # the reason of a request that failed on the way: "failed: <kind>: <words>"


def failure_counts(requests: Mapping[str, Any]) -> dict[str, int]:
    """How many requests failed of each kind ("http 503", "timeout", "connection", ...), most frequent first."""
    kinds = [reason[len(FAILED) :].split(":")[0] for reason in requests["reason"] if reason.startswith(FAILED)]
    if not kinds:
        return {}
    return {str(k): int(v) for k, v in pd.Series(kinds).value_counts().items()}


def rejection_reason(reason: str) -> str:
    """A reject reason without the request's own lengths: "exceed the context length 8192",
    "leave no room for output: prompts must be under 4090 tokens (...)"."""
    return re.sub(r"^input \d+ (\+ output \d+ )?tokens ", "", reason)


def rejection_counts(requests: Mapping[str, Any]) -> dict[str, int]:
    """How many requests were rejected for each reason, most frequent first (requests_frame's
    columns: the frame or requests_table's dict)."""
    reasons = [rejection_reason(reason) for reason, status in zip(requests["reason"], requests["status"]) if status == "rejected"]
    if not reasons:
        return {}
    return {str(k): int(v) for k, v in pd.Series(reasons).value_counts().items()}


def run_summary(requests: Mapping[str, Any], num_steps: int, simulated_s: float, kv_tokens: int | None) -> dict:
    """run.json's summary: summarize() and what the run itself knows."""
    return summarize(requests) | {"num_steps": num_steps, "simulated_s": simulated_s, "kv_tokens": kv_tokens}
