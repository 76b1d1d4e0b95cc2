"""Two runs side by side: their summary metrics, and why they may not be comparable.

RUN_A is the reference: relative error = (B - A) / A. The usual pair is a
simulated run (A or B) and a real run of the same trace and options, so the
mode, the hardware and the real engine's settings are never differences; what
changes the workload or the scheduler's decisions is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.runs.folder import Run
from testbed.runs.metrics import LATENCIES, summarize

STATS = ("mean", "p50", "p90", "p99")
LATENCY_KEYS = tuple(f"{s}_{name}_ms" for name in LATENCIES for s in STATS)
OTHER_KEYS = ("request_throughput", "output_throughput", "input_throughput", "cache_hit_rate", "completed")
METRIC_KEYS = LATENCY_KEYS + OTHER_KEYS

# Replay options that change the workload or the scheduler, compared as run.json
# recorded them. kv_tokens, max_running_requests, format and model are compared
# by their effective values (see differences).
WORKLOAD_OPTIONS = (
    "policy",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "overlap",
    "disable_radix_cache",
    "time_scale",
    "max_requests",
    "seed",
    "scheduler",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_mixed_chunk",
    "enable_priority_scheduling",
    "priority_scheduling_preemption_threshold",
    "schedule_conservativeness",
    "concurrency",  # closed loop: N clients (None: open loop, the trace's arrival times)
)
# What a run folder written before an option existed ran with.
OPTION_DEFAULTS = {"scheduler": "sglang"}
IMPORTED_MODE = "imported"
SERVER_MODE = "server"
# What a server run's options say about its load (the rest are the server's own settings).
SERVER_LOAD_OPTIONS = ("time_scale", "max_requests", "rate", "concurrency")
# Formats without arrival times: only for these does --rate shape the workload.
FORMATS_WITHOUT_ARRIVALS = ("sharegpt",)


@dataclass
class MetricRow:
    name: str
    a: float | int | None
    b: float | int | None
    rel_err: float | None  # (b - a) / a; None when a is 0 or either is missing


def _number(v) -> float | int | None:
    """A summary value as a number; None for missing, non-numeric or NaN/inf."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if math.isfinite(v) else None


def rel_err(a, b) -> float | None:
    a, b = _number(a), _number(b)
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a


def ttft_basis(*runs: Run) -> str:
    """What the runs' TTFT and E2E are measured from (metrics.py): the scheduler's intake of each
    request ("queued") where any of them was stamped so by its engine, else its arrival."""
    return "queued" if any(run.meta.get("ttft_from") == "queued" for run in runs) else "arrival"


def _measures_from(run: Run) -> str:
    return run.meta.get("ttft_from", "arrival")


def _knows_intake(run: Run) -> bool:
    return "queued" in run.requests.columns and bool(run.requests["queued"].notna().any())


def summary_from(run: Run, basis: str) -> dict:
    """The run's summary with its TTFT and E2E measured from `basis` ("arrival" or "queued"):
    recomputed from its requests where it measured them otherwise and knows when each request was
    taken in (else as it is: differences() says why the two are not comparable)."""
    if _measures_from(run) == basis or not _knows_intake(run):
        return run.summary
    measured = summarize(run.requests, basis)
    return run.summary | {k: v for k, v in measured.items() if k.endswith(("_ttft_ms", "_e2e_ms"))}


def compare_runs(a: Run, b: Run, basis: str | None = None) -> list[MetricRow]:
    """One row per metric of METRIC_KEYS, in that order; TTFT and E2E from the same start in both
    (basis, by default ttft_basis(a, b))."""
    basis = basis or ttft_basis(a, b)
    sa, sb = summary_from(a, basis), summary_from(b, basis)
    rows = []
    for key in METRIC_KEYS:
        va, vb = _number(sa.get(key)), _number(sb.get(key))
        rows.append(MetricRow(key, va, vb, rel_err(va, vb)))
    return rows


def _opt(run: Run, name: str):
    return (run.meta.get("options") or {}).get(name, OPTION_DEFAULTS.get(name))


def _imported_options(a: Run, b: Run) -> set[str] | None:
    """The options an imported run (of another system) or a server run states; None when neither is one.
    Only those can be compared: the rest of its engine is not this testbed's options."""
    stated: set[str] | None = None
    for run in (a, b):
        if run.meta.get("mode") == IMPORTED_MODE:
            known = {k for k, v in (run.meta.get("options") or {}).items() if v is not None}
        elif run.meta.get("mode") == SERVER_MODE:  # the server's own settings are not this testbed's options
            known = set(SERVER_LOAD_OPTIONS)
        else:
            continue
        stated = known if stated is None else stated & known
    return stated


def _effective(run: Run, name: str):
    """What the scheduler got (run.json "scheduler"), else what was asked for."""
    sched = run.meta.get("scheduler") or {}
    if name in sched:
        return sched[name]
    if name == "kv_tokens" and "kv_tokens" in run.summary:
        return run.summary["kv_tokens"]
    return _opt(run, name)


def _trace(run: Run) -> dict:
    return run.meta.get("trace") or {}


def _show(v) -> str:
    return "default" if v is None else str(v)


def differences(a: Run, b: Run) -> list[str]:
    """Why A and B are not comparable, one human-readable line each; [] if they are."""
    out = []
    for label, run in (("A", a), ("B", b)):
        if run.status != "complete":
            out.append(f"run {label} ({run.path}) is {run.status}, not complete")

    basis = ttft_basis(a, b)
    for label, run in (("A", a), ("B", b)):
        if _measures_from(run) != basis and not _knows_intake(run):
            out.append(
                f"TTFT: the other run measures it from the engine's intake of each request (vLLM's queued_ts), "
                f"run {label} ({run.path}) from arrival and records no intake times (a run of an older testbed: rerun it)"
            )

    ta, tb = _trace(a), _trace(b)
    if ta.get("sha256") != tb.get("sha256"):
        out.append(
            f"trace: A replayed {ta.get('path')} (sha256 {str(ta.get('sha256'))[:12]}), "
            f"B replayed {tb.get('path')} (sha256 {str(tb.get('sha256'))[:12]})"
        )
    # The format a trace was read as (detected or given), not the --format flag.
    fa, fb = ta.get("format", _opt(a, "format")), tb.get("format", _opt(b, "format"))
    if fa != fb:
        out.append(f"format: A read the trace as {_show(fa)}, B as {_show(fb)}")
    if _opt(a, "rate") != _opt(b, "rate") and (fa in FORMATS_WITHOUT_ARRIVALS or fb in FORMATS_WITHOUT_ARRIVALS):
        out.append(f"rate: A {_show(_opt(a, 'rate'))}, B {_show(_opt(b, 'rate'))} req/s")
    ma, mb = a.meta.get("model", _opt(a, "model")), b.meta.get("model", _opt(b, "model"))
    if ma != mb:
        out.append(f"model: A {_show(ma)}, B {_show(mb)}")

    imported = _imported_options(a, b)
    for name in WORKLOAD_OPTIONS:
        if imported is not None and name not in imported:
            continue
        va, vb = _opt(a, name), _opt(b, name)
        if va != vb:
            out.append(
                f"{name}: A {_show(va)}, B {_show(vb)}"
                + (" (clients of a closed loop; default: open loop)" if name == "concurrency" else "")
            )
    if imported is not None:
        # The KV pool only where the imported run states it.
        ka, kb = _effective(a, "kv_tokens"), _effective(b, "kv_tokens")
        if ka is not None and kb is not None and ka != kb:
            out.append(f"kv_tokens: A {_show(ka)}, B {_show(kb)} (KV pool in tokens; give the sim --kv-tokens)")
        return out

    # A KV pool of the same size is the same scheduler, however it was sized
    # (--kv-tokens, device memory, mem_fraction_static, kv_memory_gb).
    ka, kb = _effective(a, "kv_tokens"), _effective(b, "kv_tokens")
    if ka != kb:
        out.append(f"kv_tokens: A {_show(ka)}, B {_show(kb)} (KV pool in tokens; give both runs the same --kv-tokens)")
    ra, rb = _effective(a, "max_running_requests"), _effective(b, "max_running_requests")
    asked_same = _opt(a, "max_running_requests") == _opt(b, "max_running_requests")
    # The default cap follows the pool size: already reported above as kv_tokens.
    if ra != rb and not (asked_same and ka != kb):
        out.append(f"max_running_requests: A {_show(ra)}, B {_show(rb)}")
    return out
