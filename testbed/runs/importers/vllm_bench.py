"""`vllm-bench`: the result file of `vllm bench serve --save-result --save-detailed` (vLLM 0.19,
vllm/benchmarks/serve.py).

One JSON object (one per line with --append-result; the last is read unless --entry N):
run settings (backend, model_id, request_rate, burstiness, max_concurrency, and any
--metadata KEY=VALUE), the summary, and with --save-detailed one list entry per request:
input_lens, output_lens, ttfts (s), itls (s, between streamed chunks), start_times
(time.perf_counter() when the client sent the request), errors ("" if it succeeded).
Arrival = start_time (the client's clock: network time counts in TTFT). Lacks: prompt
tokens (no prefix sharing in the trace), the engine's settings beyond what --metadata
recorded, queueing and scheduling times, cached tokens.
"""

from __future__ import annotations

import itertools

from testbed.errors import TraceError
from testbed.runs.importers.imported import ImportedRun, count, fail, failed_req, finished_req, json_lines, number

DETAIL_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors")


def looks_like(obj: object) -> bool:
    return isinstance(obj, dict) and ("start_times" in obj or "endpoint_type" in obj or "burstiness" in obj)


def pick_entry(path: str, entry: int | None, detail_key: str, flag: str) -> tuple[int, dict]:
    """(line, object) of the run to import: the last in the file, or line `entry`."""
    objects = list(json_lines(path))
    if not objects:
        raise TraceError(path, None, None, "empty file")
    if entry is not None:
        chosen = [(ln, obj) for ln, obj in objects if ln == entry]
        if not chosen:
            raise TraceError(
                path,
                entry,
                None,
                f"--entry {entry}: no JSON object on that line (objects on lines {', '.join(str(ln) for ln, _ in objects)})",
            )
        lineno, obj = chosen[0]
    else:
        lineno, obj = objects[-1]
    if not isinstance(obj, dict):
        raise fail((path, lineno), None, f"expected a JSON object, got {type(obj).__name__}")
    if detail_key not in obj:
        raise fail((path, lineno), detail_key, f"missing: no per-request data; run the benchmark with {flag}")
    return lineno, obj


def detail_lists(obj: dict, keys: tuple[str, ...], where) -> list[list]:
    lists = []
    for key in keys:
        value = obj.get(key)
        if not isinstance(value, list):
            raise fail(where, key, f"must be a list with one entry per request, got {type(value).__name__}")
        lists.append(value)
    n = len(lists[0])
    for key, value in zip(keys, lists):
        if len(value) != n:
            raise fail(where, key, f"has {len(value)} entries, {keys[0]} has {n}")
    if n == 0:
        raise fail(where, keys[0], "no requests")
    return lists


def request_times(i: int, ttft, itl, start: float, where) -> tuple[float, list[float]]:
    """(first token, token times) of request i from its TTFT and inter-chunk gaps."""
    first = start + number(ttft, f"ttfts[{i}]", where)
    if not isinstance(itl, list):
        raise fail(where, f"itls[{i}]", f"must be a list of seconds, got {type(itl).__name__}")
    gaps = [number(g, f"itls[{i}][{j}]", where) for j, g in enumerate(itl)]
    return first, [first, *(first + t for t in itertools.accumulate(gaps))]


def load(path: str, entry: int | None = None) -> ImportedRun:
    lineno, obj = pick_entry(path, entry, "start_times", "--save-result --save-detailed")
    where = (path, lineno)
    inputs, outputs, ttfts, itls, starts, errors = detail_lists(obj, DETAIL_LISTS, where)
    t0 = min(number(s, f"start_times[{i}]", where) for i, s in enumerate(starts))
    done, failed = [], []
    for i, (inp, out, ttft, itl, start, err) in enumerate(zip(inputs, outputs, ttfts, itls, starts, errors)):
        input_len = count(inp, f"input_lens[{i}]", where, 0)
        output_len = count(out, f"output_lens[{i}]", where, 0)
        arrival = number(start, f"start_times[{i}]", where) - t0
        if err or output_len == 0:
            failed.append(failed_req(str(i), input_len, arrival, str(err or "no output")))
            continue
        first, times = request_times(i, ttft, itl, arrival, where)
        done.append(finished_req(str(i), count(inp, f"input_lens[{i}]", where, 1), output_len, arrival, first, times[-1], times))
    done.sort(key=lambda r: r.arrival_time)
    backend = str(obj.get("backend") or obj.get("endpoint_type") or "")
    settings = ("backend", "label", "request_rate", "burstiness", "max_concurrency", "date")
    engine = {k: obj[k] for k in settings if k in obj}
    engine |= {k: v for k, v in obj.items() if isinstance(v, str) and k not in engine and k not in ("model_id", "tokenizer_id")}
    missing = [
        "the engine's settings: only the client's (backend, rate, concurrency) and --metadata KEY=VALUE pairs",
        "prompt tokens: lengths only, so the trace has no prefix sharing and the cache hit rate is unknown",
        "token times are those of streamed chunks: with several tokens in a chunk, ITL counts one gap per chunk",
    ]
    scheduler = "sglang" if backend.startswith("sglang") else "vllm"
    return ImportedRun("vllm-bench", done + failed, obj.get("model_id"), scheduler, engine, {"scheduler": scheduler}, None, None, missing)
