"""`llmservingsim`: a real vLLM run recorded by LLMServingSim's bench runner (bench/core/recorder.py).

requests.jsonl, one line per request: request_id, input_toks, output_toks, arrival_time
(client wall clock), queued_ts, scheduled_ts, first_token_ts, last_token_ts (one monotonic
clock, seconds). A meta.json beside it holds the engine arguments (engine_kwargs), the
vLLM version, and in newer runs the KV cache vLLM allocated (kv_cache) and the GPU
(hardware). Arrival = queued_ts: when vLLM's engine core read the request in, between two of its steps
(it reaches the engine earlier, arrival_time, and waits for the step in flight to end), so TTFT is
measured from that intake (run.json `ttft_from: "queued"`), and a replay compared with it from its
own scheduler's intake. Lacks: prompt tokens (lengths only, so no prefix
sharing), the time of every token but the first and last (so no ITL), cached tokens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from testbed.errors import TraceError
from testbed.runs.importers.imported import ImportedRun, count, fail, failed_req, finished_req, json_lines, number, require

TIMES = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")


def looks_like(obj: object) -> bool:
    return isinstance(obj, dict) and {"input_toks", "output_toks", "queued_ts", "first_token_ts"} <= obj.keys()


def read_meta(path: Path) -> dict:
    meta_path = path.parent / "meta.json"
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TraceError(str(meta_path), e.lineno, None, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(meta, dict):
        raise TraceError(str(meta_path), 1, None, "expected a JSON object")
    return meta


def engine_options(meta: dict) -> tuple[dict, dict, int | None]:
    """(engine settings, the replay options they amount to, KV pool tokens) from meta.json."""
    kwargs = meta.get("engine_kwargs") or {}
    kv = meta.get("kv_cache") or {}
    sched_cfg = (meta.get("resolved_config") or {}).get("scheduler_config") or {}
    engine = {"vllm_version": meta.get("vllm_version"), **kwargs}
    if kv:
        engine["kv_cache"] = kv
    options: dict = {"scheduler": "vllm"}
    for key in ("max_num_seqs", "max_num_batched_tokens"):
        if isinstance(kwargs.get(key), int):
            options[key] = kwargs[key]
    if isinstance(kv.get("block_size"), int):
        options["page_size"] = kv["block_size"]
    if isinstance(kv.get("enable_prefix_caching"), bool):
        options["disable_radix_cache"] = not kv["enable_prefix_caching"]
    if isinstance(sched_cfg.get("async_scheduling"), bool):
        options["overlap"] = sched_cfg["async_scheduling"]
    kv_tokens = kv.get("num_kv_tokens") if isinstance(kv.get("num_kv_tokens"), int) else None
    return engine, options, kv_tokens


def check_one_clock(done: list) -> None:
    """Each request's queued_ts on the run's monotonic clock. A request is sent (arrival_time, the
    client's wall clock) and queued a moment later, so arrival_time - queued_ts is one offset for the
    whole run, give or take the network; a row whose offset is further from the run's median than the
    run lasts was stamped on another clock (a queued_ts of 0 made the mean TTFT 26 hours)."""
    stamped = [(r[0], r[4]) for r in done if "arrival_time" in r[4]]
    if len(stamped) < 3:
        return
    offsets = sorted(t["arrival_time"] - t["queued_ts"] for _, t in stamped)
    median = offsets[len(offsets) // 2]
    sends = [t["arrival_time"] for _, t in stamped]
    spans = sorted(t["last_token_ts"] - t["queued_ts"] for _, t in stamped)  # the off-clock row's own is not one
    # How long the run lasts, generously: its sends, twice a typical request, and a minute for the client's
    # and network's delays; an offset further off than that cannot be network time.
    lasts = max(sends) - min(sends) + 2 * spans[len(spans) // 2] + 60.0
    for where, t in stamped:
        off = t["arrival_time"] - t["queued_ts"] - median
        if abs(off) > lasts:
            raise fail(
                where,
                "queued_ts",
                f"is {t['queued_ts']!r}, {abs(off):,.0f} s off the clock of the run's other "
                f"requests (arrival_time - queued_ts is {median:,.3f} s for them): not on the run's clock",
            )


def load(path: str) -> ImportedRun:
    rows = []
    for lineno, obj in json_lines(path):
        where = (path, lineno)
        if not isinstance(obj, dict):
            raise fail(where, None, f"a request must be a JSON object, got {type(obj).__name__}")
        rid = str(obj.get("request_id", lineno))
        input_len = count(require(obj, "input_toks", where), "input_toks", where, 1)
        output_len = count(require(obj, "output_toks", where), "output_toks", where, 0)
        times = {k: require(obj, k, where) for k in TIMES}
        if any(v is None for v in times.values()) or output_len == 0:
            rows.append((where, rid, input_len, output_len, None))
            continue
        t = {k: number(v, k, where) for k, v in times.items()}
        for a, b in zip(TIMES, TIMES[1:]):
            if t[b] < t[a]:
                raise fail(where, b, f"is {t[b]!r}, before {a} {t[a]!r}")
        sent = obj.get("arrival_time")
        if isinstance(sent, (int, float)) and not isinstance(sent, bool) and math.isfinite(sent):
            t["arrival_time"] = float(sent)
        rows.append((where, rid, input_len, output_len, t))
    if not rows:
        raise TraceError(path, None, None, "no requests")
    done = [r for r in rows if r[4] is not None]
    check_one_clock(done)
    t0 = min((r[4]["queued_ts"] for r in done), default=0.0)
    reqs = [
        finished_req(
            rid,
            i,
            o,
            t["queued_ts"] - t0,
            t["first_token_ts"] - t0,
            t["last_token_ts"] - t0,
            scheduled=t["scheduled_ts"] - t0,
            queued=t["queued_ts"] - t0,
        )
        for _, rid, i, o, t in sorted(done, key=lambda r: r[4]["queued_ts"])
    ]
    reqs += [failed_req(rid, i, 0.0, "no timestamps recorded") for _, rid, i, _, t in rows if t is None]
    meta = read_meta(Path(path))
    engine, options, kv_tokens = engine_options(meta)
    hw = (meta.get("hardware") or {}).get("device_name")
    missing = [
        "per-token times: only the first and last token's, so ITL is unknown (left empty); TPOT is (last - first) / (output - 1)",
        "prompt tokens: lengths only, so the trace has no prefix sharing and the cache hit rate is unknown",
    ]
    if not meta:
        missing.append("meta.json (engine settings) was not found beside the file")
    return ImportedRun("llmservingsim", reqs, meta.get("model"), "vllm", engine, options, hw, kv_tokens, missing, ttft_from="queued")
