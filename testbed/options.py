"""The replay options' flags: what a replay takes on the command line and how a value is parsed.

`testbed replay`, `testbed sweep` (whose grid axes are these options) and `testbed capacity`
all read them from here: one definition of every option's --flag and default; the checks are in
option_checks.py, ReplayOptions in replay_options.py (both re-exported here). Every
ReplayOptions field has a --flag of the same name (underscores as dashes).
"""

from __future__ import annotations

import argparse
import functools
import typing
from dataclasses import replace
from typing import Any

# The --model and --policy choices; the dashboard offers the same ones through this module.
from scheduler.model_config import bundled_model_names
from scheduler.sglang.policy import POLICIES
from scheduler.vllm.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, VLLM_RELEASE
from simulator.cluster.kv_link import KV_LINK_FORMAT
from simulator.cluster.routing import ROUTERS
from simulator.costs.cuda_graphs import VLLM_CUDAGRAPH_MODES, VLLM_MAX_CAPTURE_TOKENS
from simulator.costs.precision import KV_CACHE_DTYPES, QUANTIZATIONS
from testbed.live.endpoints import ENDPOINTS
from testbed.option_checks import SCHEDULERS, SIZE_LIMITS, check_options, closed_loop_note  # noqa: F401 - re-exported

# ReplayOptions and its machine-dependent defaults live in replay_options.py; every caller
# imports them from here, with the flags and checks.
from testbed.replay_options import (  # noqa: F401 - re-exported
    MODES,
    OPTION_FIELDS,
    ReplayOptions,
    default_hardware,
    default_model,
    default_overlap,
    flag,
    recorded_options,
)
from testbed.schedulers import scheduler_kind
from testbed.traces.formats import FORMATS


def resolved_options(opts: ReplayOptions) -> ReplayOptions:
    """The options with their defaults resolved: what ran, as run.json records it."""
    return with_scheduler_defaults(
        replace(opts, model=opts.model or default_model(opts.mode), overlap=default_overlap(opts), hardware=default_hardware(opts))
    )


def with_scheduler_defaults(opts: ReplayOptions) -> ReplayOptions:
    """The page size and budgets left unset, as the scheduler opts names takes them."""
    return scheduler_kind(opts.scheduler).with_defaults(opts)


# --- flags ------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_replay_options(p: argparse.ArgumentParser) -> None:
    """The options every replay takes (also the axes of a sweep)."""
    d = ReplayOptions()
    p.add_argument(
        "--mode", choices=MODES, default=d.mode, help="simulate, run the real engine, or send the trace to a live server (--url)"
    )
    p.add_argument("--policy", choices=POLICIES, default=d.policy, help="waiting-queue order (default %(default)s)")
    p.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="prefill chunk in tokens; <= 0 disables chunking (default: SGLang's for the device memory, 8192 on an H100)",
    )
    p.add_argument(
        "--max-prefill-tokens", type=positive_int, default=d.max_prefill_tokens, help="new tokens per prefill batch (default %(default)s)"
    )
    p.add_argument(
        "--page-size", type=positive_int, default=None, help="KV page size in tokens (default 1; 16 with --scheduler vllm, its block size)"
    )
    p.add_argument(
        "--kv-tokens", type=positive_int, default=None, help="KV pool size in tokens (default: from the model and the device memory)"
    )
    p.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="device memory share for weights and KV (default: SGLang's for the device memory and chunk size, 0.83 on an H100)",
    )
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="overlap scheduling with the forward (default on; off for the real engine on a CPU)",
    )
    p.add_argument("--disable-radix-cache", action="store_true", help="no prefix cache")
    p.add_argument("--max-running-requests", type=positive_int, default=None, help="cap on the running batch (default: from the KV pool)")
    p.add_argument(
        "--model",
        default=None,
        help=f"bundled config ({', '.join(bundled_model_names())}) or a local HF folder / config.json (default llama-3.1-8b; tiny-llama for --mode real on a CPU)",
    )
    p.add_argument(
        "--hardware",
        default=None,
        help="hardware spec: h100, h200, a100, rtx4090, cpu, one of AIConfigurator's systems (h100_sxm, rtx_pro_6000_server, ...; with its database installed), or a JSON file (default: h100 for the simulator, "
        "or the one a --profile was made for; for --mode real, the spec of its device)",
    )
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=d.time_scale,
        help="multiply arrival times: 2 stretches them (half the load), 0.5 compresses (default %(default)s)",
    )
    p.add_argument("--max-requests", type=positive_int, default=None, help="replay only the first N requests")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every random choice (default %(default)s)")
    p.add_argument("--format", choices=FORMATS, default=None, help="trace format (default: detected from the content)")
    p.add_argument("--rate", type=positive_float, default=None, help="request rate for traces without arrival times (ShareGPT lengths)")
    p.add_argument(
        "--profile",
        default=None,
        help="sim: cost every forward and CPU stage from a profile (testbed calibrate: this machine's engine, or --source aiconfigurator: measured GPU kernels) instead of the roofline",
    )
    p.add_argument(
        "--tp", type=positive_int, default=d.tp, help="sim: tensor parallelism over this many GPUs of --hardware (default %(default)s)"
    )
    p.add_argument(
        "--quantization",
        choices=QUANTIZATIONS,
        default=None,
        help="sim: the linear layers' weights in fp8 (per tensor, as SGLang's and vLLM's --quantization fp8), fp8_block (128x128-block scales, as block-quantized FP8 checkpoints) or nvfp4 (ModelOpt FP4); priced at the format's tensor-core peak, or from a kernel profile's tables of that format (default: the model's dtype)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        default=d.kv_cache_dtype,
        help="sim: the KV cache's dtype; fp8 holds twice the tokens in the same memory (default %(default)s: the model's dtype)",
    )
    p.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        default=d.scheduler,
        help=f"SGLang's scheduler or vLLM's (v1, release {VLLM_RELEASE}) (default %(default)s)",
    )
    p.add_argument(
        "--max-num-seqs", type=positive_int, default=None, help=f"vllm: running requests at most (default {DEFAULT_MAX_NUM_SEQS})"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        help=f"vllm: tokens one step computes, decodes and prefill chunks together (default {DEFAULT_MAX_NUM_BATCHED_TOKENS})",
    )
    p.add_argument(
        "--max-cudagraph-capture-size",
        type=positive_int,
        default=None,
        help=f"vllm: the largest step (tokens) a CUDA graph replays; larger ones run eagerly, paying the profile's host dispatch (default min(2 x --max-num-seqs, {VLLM_MAX_CAPTURE_TOKENS}))",
    )
    p.add_argument(
        "--cudagraph-mode",
        choices=VLLM_CUDAGRAPH_MODES,
        default=None,
        help="vllm: which steps replay CUDA graphs, as its compilation config's cudagraph_mode: FULL_AND_PIECEWISE or PIECEWISE or FULL "
        "(every step up to the capture size; the default), FULL_DECODE_ONLY (decode-only steps), NONE (none)",
    )
    p.add_argument(
        "--enable-mixed-chunk",
        action="store_true",
        help="running requests decode inside a prefill batch (a mixed forward), as SGLang's flag",
    )
    p.add_argument(
        "--enable-priority-scheduling",
        action="store_true",
        help="order the waiting queue by request priority (larger first) and preempt running requests of lower priority",
    )
    p.add_argument(
        "--priority-scheduling-preemption-threshold",
        type=int,
        default=d.priority_scheduling_preemption_threshold,
        help="priority gap a waiting request needs over a running one to preempt it (default %(default)s)",
    )
    p.add_argument(
        "--schedule-conservativeness",
        type=positive_float,
        default=d.schedule_conservativeness,
        help="scale of the decode estimate that admission reserves (new_token_ratio); > 1 admits fewer (default %(default)s)",
    )
    p.add_argument(
        "--scheduler-recv-interval",
        type=positive_int,
        default=d.scheduler_recv_interval,
        metavar="N",
        help="SGLang: take in new requests once every N decode steps (at once after a prefill or when idle), as SGLang's "
        "flag; servers raise it to poll less (default %(default)s: before every step)",
    )
    p.add_argument(
        "--concurrency",
        type=positive_int,
        default=None,
        metavar="N",
        help="closed loop: N clients, each sending its next request "
        "(in trace order) when its last one finishes, as vllm bench serve / sglang.bench_serving --max-concurrency; the first N "
        "arrive at 0 and the trace's arrival times are ignored (so --time-scale and --rate are refused with it; default: open loop)",
    )
    p.add_argument(
        "--fast-forward",
        action=argparse.BooleanOptionalAction,
        default=d.fast_forward,
        help="sim: take runs of identical decode steps at once, with the same results as one by one (default on; --no-fast-forward steps one by one, for checking)",
    )
    g = p.add_argument_group("a mixture of experts (--mode sim)")
    g.add_argument(
        "--ep",
        type=positive_int,
        default=d.ep,
        metavar="N",
        help="expert parallelism: the routed experts spread over N ranks of the --tp x --dp GPUs, num_experts / N whole "
        "experts each, split over (tp x dp) / N GPUs; N must divide the experts and the GPUs (default %(default)s)",
    )
    g.add_argument(
        "--dp",
        type=positive_int,
        default=d.dp,
        metavar="N",
        help="attention data parallelism (with --enable-dp-attention): N ranks, each with its own requests, KV and "
        "attention over --tp GPUs, so tp x dp GPUs in all (SGLang's --tp 8 --dp 8 --enable-dp-attention is --tp 1 --dp 8 here, as "
        "vLLM's -tp 1 -dp 8); one scheduler stands for the N ranks, its KV pool theirs together, requests spread round-robin; "
        "vLLM's --max-num-seqs and --max-num-batched-tokens are each rank's, SGLang's limits the server's "
        "(default %(default)s)",
    )
    g.add_argument("--enable-dp-attention", action="store_true", help="run attention data parallel over --dp ranks, as SGLang's flag")
    g.add_argument(
        "--expert-imbalance",
        type=positive_float,
        default=None,
        metavar="ALPHA",
        help="the experts' load skewed as AIConfigurator's power law with exponent ALPHA (its SDK uses 1.01), the busiest "
        "rank setting each MoE layer's time (default: balanced routing)",
    )
    g = p.add_argument_group("real engine (--mode real)")
    g.add_argument(
        "--load-format",
        choices=("auto", "dummy"),
        default=None,
        help="weights from the model folder (auto) or random (dummy); default: auto for a folder, dummy for a bundled config",
    )
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default=d.device, help="default: CUDA if present, else the CPU")
    g.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16", "float16"), default=d.dtype, help="default: bfloat16 on CUDA, float32 on the CPU"
    )
    g.add_argument(
        "--attention-backend",
        choices=("auto", "torch", "flashinfer"),
        default=d.attention_backend,
        help="default: flashinfer on CUDA when installed, else torch",
    )
    g.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="CUDA: run decode batches eagerly instead of replaying CUDA graphs (SGLang's option; graphs: torch backend only)",
    )
    g.add_argument(
        "--kv-memory-gb",
        type=positive_float,
        default=d.kv_memory_gb,
        help="CPU: KV cache budget when --kv-tokens is not given (default %(default)s)",
    )
    g = p.add_argument_group("a cluster (--mode sim): replicas behind a router")
    g.add_argument(
        "--replicas", type=positive_int, default=d.replicas, help="instances, each a whole scheduler with its own KV pool (default 1)"
    )
    g.add_argument("--router", choices=ROUTERS, default=d.router, help="how the router picks an instance (default %(default)s)")
    g.add_argument(
        "--router-refresh-ms",
        type=float,
        default=d.router_refresh_ms,
        help="how stale the router's view of each instance's load is, in ms (default 0: exact at every decision)",
    )
    g.add_argument(
        "--router-latency-ms", type=float, default=d.router_latency_ms, help="added to every request on its way to an instance (default 0)"
    )
    g.add_argument(
        "--router-weights", default=None, help="weighted router: NAME=WEIGHT,... of prefix, queue, kv (default prefix=2,queue=1,kv=1)"
    )
    g.add_argument(
        "--cache-threshold",
        type=float,
        default=d.cache_threshold,
        help="cache-aware: the match rate that picks the best-matching instance (default %(default)s)",
    )
    g.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=d.balance_abs_threshold,
        help="cache-aware: load imbalance, max - min requests above this (default %(default)s)",
    )
    g.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=d.balance_rel_threshold,
        help="cache-aware: and max above this times min (default %(default)s)",
    )
    g = p.add_argument_group("prefill/decode disaggregation (--mode sim), instead of --replicas")
    g.add_argument(
        "--prefill-replicas",
        type=positive_int,
        default=None,
        metavar="P",
        help="prefill instances (with --decode-replicas); --router picks one",
    )
    g.add_argument(
        "--decode-replicas",
        type=positive_int,
        default=None,
        metavar="D",
        help="decode instances (with --prefill-replicas); the one with the fewest outstanding tokens takes a request",
    )
    g.add_argument(
        "--kv-link",
        default=d.kv_link,
        metavar="LINK",
        help=f"the link the KV crosses, per GPU one way, shared by the transfers under way: {KV_LINK_FORMAT} (default %(default)s)",
    )
    g = p.add_argument_group("a live server (--mode server)")
    g.add_argument("--url", default=None, help="the OpenAI-compatible server to send the trace to, e.g. http://127.0.0.1:8000")
    g.add_argument(
        "--endpoint", choices=tuple(ENDPOINTS), default=d.endpoint, help="/v1/completions or /v1/chat/completions (default %(default)s)"
    )
    g.add_argument("--served-model", default=None, help="the model name requests give (default: the server's first in /v1/models)")
    g.add_argument(
        "--request-timeout", type=positive_float, default=None, help="seconds a request may take before it counts as failed (default: none)"
    )


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    # Every ReplayOptions field has a --flag of the same name (add_replay_options).
    return ReplayOptions(**{name: getattr(args, name) for name in OPTION_FIELDS})


# --- one value, as its flag takes it (a sweep's grid axis) --------------------------------------

_OPTION_TYPES = typing.get_type_hints(ReplayOptions)
_TRUE = ("on", "true", "yes", "1")
_FALSE = ("off", "false", "no", "0")


class _RaisingParser(argparse.ArgumentParser):
    """The replay options' parser, raising instead of exiting: it checks one value."""

    def error(self, message: str) -> typing.NoReturn:
        raise ValueError(message)


@functools.cache
def _value_parser() -> _RaisingParser:
    p = _RaisingParser(add_help=False)
    add_replay_options(p)
    return p


def parse_option_value(name: str, text: str) -> Any:
    """`text` as replay option `name` takes it: on/off/true/false for a switch, none for an
    option that can be unset, anything else as its --flag parses it (type and choices).
    Raises ValueError with the reason."""
    hint = _OPTION_TYPES[name]
    kinds = typing.get_args(hint) or (hint,)
    low = text.strip().lower()
    if type(None) in kinds and low == "none":
        return None
    if bool in kinds:
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError(f"expected on/off/true/false{' or none' if type(None) in kinds else ''}")
    # The = form, so that a negative number is a value and not a flag.
    ns = _value_parser().parse_args([f"{flag(name)}={text}"])
    return getattr(ns, name)
