"""Whether a set of replay options can run: each refused with one line naming the option and why,
before any work starts (testbed replay, and every point of a sweep or capacity search)."""

from __future__ import annotations

import math

from simulator.cluster.kv_link import parse_kv_link
from simulator.cluster.routing import ROUTERS, parse_weights
from simulator.costs.precision import KV_CACHE_DTYPES, QUANTIZATIONS
from testbed.errors import ConfigError
from testbed.live.endpoints import check_server_options
from testbed.replay_options import MODES, ReplayOptions, flag
from testbed.schedulers import SCHEDULER_KINDS, check_scheduler_options

SCHEDULERS = tuple(SCHEDULER_KINDS)

# Upper bounds of the size options, each with why (a larger value is refused, naming the bound).
TOKENS_PER_FORWARD = (2**31 - 1, "tokens in one forward, which the engines index with 32-bit integers")
RUNNING_REQUESTS = (2**20, "running requests: the request table is allocated whole (10^7 rows took 1.4 GB)")
SIZE_LIMITS: dict[str, tuple[int, str]] = {
    "chunked_prefill_size": TOKENS_PER_FORWARD,
    "max_prefill_tokens": TOKENS_PER_FORWARD,
    "max_num_batched_tokens": TOKENS_PER_FORWARD,
    "kv_tokens": (2**31 - 1, "KV slots, which the engines index with 32-bit integers"),
    "page_size": (2**16, "tokens a KV page"),
    "max_running_requests": RUNNING_REQUESTS,
    "max_num_seqs": RUNNING_REQUESTS,
    "max_cudagraph_capture_size": TOKENS_PER_FORWARD,
    "concurrency": (2**20, "clients"),
}


def _check_sizes(opts: ReplayOptions) -> None:
    for name, (limit, what) in SIZE_LIMITS.items():
        value = getattr(opts, name)
        if value is not None and value > limit:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: at most {limit:,} ({what})")
    for name in ("schedule_conservativeness", "kv_memory_gb", "time_scale"):
        value = getattr(opts, name)
        if not math.isfinite(value):
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be a finite number")


def check_options(opts: ReplayOptions) -> None:
    """Reject what cannot run, before any work starts."""
    _check_sizes(opts)
    if opts.mode not in MODES:
        raise ConfigError(f"--mode {opts.mode}: choose one of {', '.join(MODES)}")
    if opts.load_format not in (None, "auto", "dummy"):
        raise ConfigError(f"--load-format {opts.load_format}: choose auto or dummy")
    if opts.mem_fraction_static is not None and not 0 < opts.mem_fraction_static <= 1:
        raise ConfigError(f"--mem-fraction-static must be in (0, 1], got {opts.mem_fraction_static}")
    if opts.tp < 1 or (opts.mode == "real" and opts.tp != 1):
        raise ConfigError(
            f"--tp {opts.tp}: " + ("must be >= 1" if opts.tp < 1 else "the real engine runs on one device; --tp is for --mode sim")
        )
    if opts.scheduler not in SCHEDULERS:
        raise ConfigError(f"--scheduler {opts.scheduler}: choose one of {', '.join(SCHEDULERS)}")
    _check_precision(opts)
    check_scheduler_options(opts)
    if not opts.schedule_conservativeness > 0:
        raise ConfigError(f"--schedule-conservativeness must be positive, got {opts.schedule_conservativeness}")
    _check_concurrency(opts)
    check_server_options(opts)
    _check_cluster(opts)
    _check_moe(opts)


def _check_moe(opts: ReplayOptions) -> None:
    """--ep, --dp, --enable-dp-attention, --expert-imbalance: positive, simulated, --dp with
    DP attention. Whether they divide the model's experts and GPUs is checked with the model
    (ModelConfig.check_parallel)."""
    for name in ("ep", "dp"):
        value = getattr(opts, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag(name)} must be a positive integer, got {value!r}")
    alpha = opts.expert_imbalance
    if alpha is not None and not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha > 0):
        raise ConfigError(f"--expert-imbalance must be a positive number (the power law's alpha), got {alpha!r}")
    if opts.dp > 1 and not opts.enable_dp_attention:
        raise ConfigError(
            f"--dp {opts.dp} is attention data parallelism: give --enable-dp-attention too (independent replicas are --replicas N)"
        )
    if opts.mode != "sim" and (opts.ep != 1 or opts.dp != 1 or opts.enable_dp_attention or alpha is not None):
        raise ConfigError("--ep, --dp, --enable-dp-attention and --expert-imbalance are for --mode sim")


def _check_cluster(opts: ReplayOptions) -> None:
    """--replicas and the router's options: a cluster is simulated, open loop."""
    if isinstance(opts.replicas, bool) or not isinstance(opts.replicas, int) or opts.replicas < 1:
        raise ConfigError(f"--replicas must be a positive integer (instances), got {opts.replicas!r}")
    if opts.router not in ROUTERS:
        raise ConfigError(f"--router {opts.router}: choose one of {', '.join(ROUTERS)}")
    for name in ("router_refresh_ms", "router_latency_ms"):
        value = getattr(opts, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ConfigError(f"--{name.replace('_', '-')} must be a number of ms >= 0, got {value!r}")
    if opts.router_weights is not None:
        try:
            parse_weights(opts.router_weights)
        except ValueError as e:
            raise ConfigError(f"--router-weights {opts.router_weights}: {e}") from None
    if not 0 <= opts.cache_threshold <= 1:
        raise ConfigError(f"--cache-threshold must be from 0 to 1, got {opts.cache_threshold}")
    if opts.replicas > 1:
        if opts.mode != "sim":
            raise ConfigError(f"--replicas {opts.replicas}: a cluster is simulated (--mode sim), not --mode {opts.mode}")
        if opts.concurrency is not None:
            raise ConfigError(f"--replicas {opts.replicas} and --concurrency: a cluster replays the trace's arrivals (open loop)")
    _check_pd(opts)


def _check_pd(opts: ReplayOptions) -> None:
    """--prefill-replicas, --decode-replicas and --kv-link: both sides or neither, a link that parses,
    simulated and open loop, instead of --replicas."""
    p, d = opts.prefill_replicas, opts.decode_replicas
    for name, value in (("prefill_replicas", p), ("decode_replicas", d)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{flag(name)} must be a positive integer (instances), got {value!r}")
    if (p is None) != (d is None):
        given, missing = ("--prefill-replicas", "--decode-replicas") if d is None else ("--decode-replicas", "--prefill-replicas")
        raise ConfigError(f"{given} {p if d is None else d} without {missing}: a PD run needs both sides")
    try:
        parse_kv_link(opts.kv_link)
    except ValueError as e:
        raise ConfigError(f"--kv-link {opts.kv_link}: {e}") from None
    if not opts.disaggregated:
        if opts.kv_link != ReplayOptions().kv_link:
            raise ConfigError(f"--kv-link {opts.kv_link} is for a PD run: give --prefill-replicas and --decode-replicas")
        return
    layout = f"--prefill-replicas {p} --decode-replicas {d}"
    if opts.replicas != 1:
        raise ConfigError(f"--replicas {opts.replicas} and {layout}: give one layout (PD instances instead of replicas)")
    if opts.mode != "sim":
        raise ConfigError(f"{layout}: prefill/decode disaggregation is simulated (--mode sim), not --mode {opts.mode}")
    if opts.concurrency is not None:
        raise ConfigError(f"{layout} and --concurrency: a PD cluster replays the trace's arrivals (open loop)")


def _check_precision(opts: ReplayOptions) -> None:
    """--quantization and --kv-cache-dtype: known values, and for the simulator (the real engine runs the model's dtype)."""
    if opts.quantization not in (None, *QUANTIZATIONS):
        raise ConfigError(
            f"--quantization {opts.quantization}: choose one of {', '.join(QUANTIZATIONS)} (or leave it unset: the model's dtype)"
        )
    if opts.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(f"--kv-cache-dtype {opts.kv_cache_dtype}: choose one of {', '.join(KV_CACHE_DTYPES)}")
    if opts.mode == "real" and (opts.quantization is not None or opts.kv_cache_dtype != "auto"):
        asked = f"--quantization {opts.quantization}" if opts.quantization is not None else f"--kv-cache-dtype {opts.kv_cache_dtype}"
        raise ConfigError(f"{asked} is for --mode sim: the real engine runs the model's dtype (--dtype)")


def _check_concurrency(opts: ReplayOptions) -> None:
    """A closed loop sends each request when a client is free: the options that shape the trace's
    arrival times have nothing to act on, so giving one with it is refused."""
    n = opts.concurrency
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"--concurrency must be a positive integer (clients), got {n!r}")
    ignored = "a closed loop sends each request when a client is free and ignores the trace's arrival times"
    if opts.time_scale != 1.0:
        raise ConfigError(f"--concurrency {n} and --time-scale {opts.time_scale:g}: {ignored}, which --time-scale scales; give one of them")
    if opts.rate is not None:
        raise ConfigError(f"--concurrency {n} and --rate {opts.rate:g}: {ignored}, which --rate makes; give one of them")


def closed_loop_note(opts: ReplayOptions) -> str | None:
    """What a closed-loop run says once (and run.json records as "arrivals"); None for an open loop."""
    n = opts.concurrency
    if n is None:
        return None
    return (
        f"closed loop: {n} client{'s' if n != 1 else ''}, each sending its next request (in trace order) when its last one "
        "is done; the trace's arrival times are ignored"
    )
