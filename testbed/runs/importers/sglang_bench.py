"""`sglang-bench`: the output file of `python -m sglang.bench_serving --output-file F --output-details`
(python/sglang/bench_serving.py).

JSONL, one line per benchmark run (the last is read unless --entry N): backend,
dataset_name, request_rate, max_concurrency, the summary, and with --output-details one
list entry per request: input_lens, output_lens, ttfts (s), itls (s, between streamed
chunks), errors. Lacks: arrival times (bench_serving draws Poisson gaps at request_rate
and does not record them): the import draws Poisson arrivals at request_rate with --seed
(all at 0 for an infinite rate), so TTFT and E2E are exact per request but the trace's
arrival pattern is a model of the real one; with max_concurrency the real run was
closed-loop, which no arrival list reproduces. Also lacks prompt tokens, engine
settings, per-request end times (E2E = TTFT + the gaps).
"""

from __future__ import annotations

import math

import numpy as np

from testbed.runs.importers.imported import ImportedRun, count, fail, failed_req, finished_req
from testbed.runs.importers.vllm_bench import detail_lists, pick_entry, request_times
from testbed.traces.gen import poisson_arrivals

DETAIL_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "errors")


def looks_like(obj: object) -> bool:
    return isinstance(obj, dict) and "start_times" not in obj and ("dataset_name" in obj or "ttfts" in obj)


def load(path: str, entry: int | None = None, seed: int = 0) -> ImportedRun:
    lineno, obj = pick_entry(path, entry, "ttfts", "--output-file F --output-details")
    where = (path, lineno)
    inputs, outputs, ttfts, itls, errors = detail_lists(obj, DETAIL_LISTS, where)
    rate = obj.get("request_rate", math.inf)  # bench_serving writes inf (JSON Infinity) for "all at once"
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        raise fail(where, "request_rate", f"must be a positive number of requests a second (Infinity: all at once), got {rate!r}")
    finite = math.isfinite(rate)
    arrivals = poisson_arrivals(len(inputs), rate, np.random.default_rng(seed)) if finite else [0.0] * len(inputs)
    done, failed = [], []
    for i, (inp, out, ttft, itl, err, arrival) in enumerate(zip(inputs, outputs, ttfts, itls, errors, arrivals)):
        input_len = count(inp, f"input_lens[{i}]", where, 0)
        output_len = count(out, f"output_lens[{i}]", where, 0)
        if err or output_len == 0:
            failed.append(failed_req(str(i), input_len, arrival, str(err or "no output")))
            continue
        first, times = request_times(i, ttft, itl, arrival, where)
        done.append(finished_req(str(i), count(inp, f"input_lens[{i}]", where, 1), output_len, arrival, first, times[-1], times))
    backend = str(obj.get("backend") or "")
    engine = {k: obj[k] for k in ("backend", "dataset_name", "request_rate", "max_concurrency") if k in obj}
    missing = [
        f"arrival times: drawn as Poisson at request_rate {rate} req/s with seed {seed}"
        if finite
        else "arrival times: request_rate is infinite, so every request arrives at 0",
        "prompt tokens: lengths only, so the trace has no prefix sharing and the cache hit rate is unknown",
        "per-request end times: E2E is TTFT plus the streamed gaps",
    ]
    if obj.get("max_concurrency"):
        missing.append(
            f"the run was closed-loop (max_concurrency {obj['max_concurrency']}): the trace's open-loop arrivals do not reproduce it"
        )
    scheduler = "vllm" if backend.startswith("vllm") else "sglang"
    return ImportedRun("sglang-bench", done + failed, obj.get("model"), scheduler, engine, {"scheduler": scheduler}, None, None, missing)
