"""vLLM v1's scheduler (scheduler/vllm/) as a replay runs it."""

from __future__ import annotations

from dataclasses import replace

from scheduler.disagg.vllm_roles import VllmDecode, VllmPrefill
from scheduler.model_config import ModelConfig
from scheduler.vllm.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    VLLM_POLICIES,
    VllmSchedulerConfig,
)
from scheduler.vllm.scheduler import VllmScheduler
from simulator.costs.cuda_graphs import vllm_graphs
from testbed.replay_options import ReplayOptions
from testbed.schedulers.kind import SchedulerKind


def with_defaults(opts: ReplayOptions) -> ReplayOptions:
    def unset(value, default):
        return default if value is None else value

    return replace(
        opts,
        page_size=unset(opts.page_size, DEFAULT_BLOCK_SIZE),
        max_num_seqs=unset(opts.max_num_seqs, DEFAULT_MAX_NUM_SEQS),
        max_num_batched_tokens=unset(opts.max_num_batched_tokens, DEFAULT_MAX_NUM_BATCHED_TOKENS),
        mem_fraction_static=unset(opts.mem_fraction_static, DEFAULT_GPU_MEMORY_UTILIZATION),
    )


def config(opts: ReplayOptions, model: ModelConfig, kv_tokens: int) -> VllmSchedulerConfig:
    # With --dp every rank runs its own engine core under these limits, and the one scheduler stands
    # for all of them (SGLang, by contrast, divides its server-wide limits over the DP ranks).
    ranks = opts.dp
    return VllmSchedulerConfig(
        journal_row_writes=opts.mode == "real",
        kv_tokens=kv_tokens,
        context_len=model.context_len,
        page_size=opts.page_size,
        max_num_batched_tokens=opts.max_num_batched_tokens * ranks,
        max_num_seqs=opts.max_num_seqs * ranks,
        policy=opts.policy,
        enable_prefix_caching=not opts.disable_radix_cache,
        overlap=opts.overlap,
        seed=opts.seed,
    )


VLLM = SchedulerKind(
    name="vllm",
    label="vLLM",
    policies=tuple(VLLM_POLICIES),
    own_options=("max_num_seqs", "max_num_batched_tokens", "max_cudagraph_capture_size", "cudagraph_mode"),
    counterparts={
        "chunked_prefill_size": "use --max-num-batched-tokens (prefills are chunked to the step's token budget)",
        "max_prefill_tokens": "use --max-num-batched-tokens",
        "max_running_requests": "use --max-num-seqs",
        "enable_mixed_chunk": "decodes always run beside prefill chunks",
        "enable_priority_scheduling": "use --policy priority",
        "priority_scheduling_preemption_threshold": "use --policy priority (it preempts by priority alone)",
        "schedule_conservativeness": "admission reserves no decode estimate (it preempts when the KV runs out)",
        "scheduler_recv_interval": "vLLM's engine core takes in new requests before every step",
    },
    chunk_option="max_num_batched_tokens",
    with_defaults=with_defaults,
    config=config,
    new=VllmScheduler,
    new_prefill=VllmPrefill,
    new_decode=VllmDecode,
    cuda_graphs=lambda opts: vllm_graphs(opts.max_num_seqs, opts.max_cudagraph_capture_size, opts.cudagraph_mode),
)
