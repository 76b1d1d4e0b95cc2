"""The summary table a person reads at the end of a replay."""

from __future__ import annotations

from testbed.runs.metrics import LATENCIES


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.2f}"
    return f"{v:,}"


def run_title(trace: str, meta: dict) -> str:
    """trace (mode, model on hardware, policy, overlap): what ran, from run.json."""
    opts = meta.get("options") or {}
    if meta.get("mode") == "server":
        srv = meta.get("server") or {}
        clients = opts.get("concurrency")
        load = f"closed loop of {clients} client{'s' if clients != 1 else ''}" if clients else "open loop"
        version = f", {srv['version']}" if srv.get("version") else ""
        return f"{trace} (server {srv.get('url')}{srv.get('endpoint', '')}, {meta.get('model')}{version}, {load})"
    overlap = "on" if opts.get("overlap") else "off"
    clients = opts.get("concurrency")
    closed = f", closed loop of {clients} client{'s' if clients != 1 else ''}" if clients else ""
    cluster = meta.get("cluster")
    if cluster and "prefill_replicas" in cluster:  # prefill/decode disaggregation
        link = cluster["kv_link"]["name"]
        replicas = f", {cluster['prefill_replicas']} prefill + {cluster['decode_replicas']} decode instances over {link} behind a {cluster['router']} router"
    else:
        replicas = f", {cluster['replicas']} replicas behind a {cluster['router']} router" if cluster else ""
    return f"{trace} ({meta.get('mode')}, {meta.get('model')} on {meta.get('hardware')}, {opts.get('policy')}, overlap {overlap}{closed}{replicas})"


def format_instances(s: dict) -> str:
    """A cluster run's line: requests per instance, and the load imbalance; a PD run's two lines, its
    instances of each role and the KV transfer."""
    if "decode_load_imbalance" not in s:
        served = "/".join(str(x["requests"]) for x in s["instances"])
        return f"instances: requests {served}, load imbalance {s['load_imbalance']:.2f} (most over mean)"
    sides = []
    for role in ("prefill", "decode"):
        served = "/".join(str(x["requests"]) for x in s["instances"] if x["role"] == role)
        sides.append(f"{role} requests {served} (imbalance {s[f'{role}_load_imbalance']:.2f})")
    held = s.get("decode_held_mean_ms")
    return (
        f"instances: {', '.join(sides)}\n"
        f"KV transfer (ms): mean {_fmt(s['kv_transfer_mean_ms'])}, p50 {_fmt(s['kv_transfer_p50_ms'])}, "
        f"p99 {_fmt(s['kv_transfer_p99_ms'])}, {s['kv_transferred_gb']:,.1f} GB   decode KV holds {s['decode_kv_holds']:,}"
        + (f" (waited {_fmt(held)} ms on average)" if held is not None else "")
    )


def format_rejections(counts: dict[str, int]) -> str:
    """'280 exceed the context length 8192, 20 do not fit the KV pool of ...' (metrics.rejection_counts)."""
    return ", ".join(f"{n:,} {reason}" for reason, n in counts.items())


def format_summary(s: dict, title: str = "") -> str:
    lines = []
    if title:
        lines.append(title)
    truncated = s.get("truncated") or 0  # outputs cut at arrival to fit the context or the KV pool
    cut = f" ({truncated} with the output cut to fit)" if truncated else ""
    lines.append(
        f"requests: {s['completed']} completed{cut}, {s.get('rejected', 0)} rejected, {s.get('unfinished', 0)} unfinished"
        + (f" ({s['failed']} of them failed)" if s.get("failed") else "")
        + f"   duration {s['duration_s']:.2f} s"
    )
    hit = s.get("cache_hit_rate")  # None: not known (an imported run)
    lines.append(
        f"throughput: {s['request_throughput']:.2f} req/s, {s['output_throughput']:,.0f} output tok/s, "
        f"{s.get('input_throughput', 0):,.0f} input tok/s   cache hit rate {'-' if hit is None else f'{hit * 100:.1f}%'}"
        f"   retractions {_fmt(s.get('num_retractions', 0))}"
    )
    stats = ("mean", "p50", "p90", "p99")
    cells = {name: [_fmt(s.get(f"{k}_{name}_ms")) for k in stats] for name in LATENCIES}
    # Columns as wide as the widest number and two spaces: a 50-minute TTFT (3,046,054.4) stays apart.
    width = max(12, 2 + max(len(c) for row in cells.values() for c in row))
    header = f"{'latency (ms)':<14}" + "".join(f"{k:>{width}}" for k in stats)
    lines.append(header)
    lines.append("-" * len(header))
    for name in LATENCIES:
        lines.append(f"{name.upper():<14}" + "".join(f"{c:>{width}}" for c in cells[name]))
    return "\n".join(lines)
