"""SGLang's scheduler (scheduler/sglang/) as a replay runs it."""

from __future__ import annotations

from dataclasses import replace

from scheduler.disagg.sglang_roles import SglangDecode, SglangPrefill
from scheduler.model_config import ModelConfig
from scheduler.sglang.config import SchedulerConfig
from scheduler.sglang.policy import POLICIES
from scheduler.sglang.scheduler import Scheduler
from scheduler.sglang.server_defaults import (
    default_chunked_prefill_size,
    default_cuda_graph_max_bs,
    default_kv_cache_dtype,
    default_mem_fraction_static,
)
from simulator.costs.cuda_graphs import CudaGraphPolicy, sglang_graphs
from testbed.replay_options import ReplayOptions, device_memory_bytes, device_sm_version
from testbed.schedulers.kind import SchedulerKind

PAGE_SIZE = 1  # SGLang's default page size


def with_defaults(opts: ReplayOptions) -> ReplayOptions:
    opts = replace(opts, page_size=PAGE_SIZE if opts.page_size is None else opts.page_size)
    if opts.chunked_prefill_size is None or opts.mem_fraction_static is None:
        # SGLang's server defaults follow the device memory.
        memory = device_memory_bytes(opts)
        chunk = default_chunked_prefill_size(memory) if opts.chunked_prefill_size is None else opts.chunked_prefill_size
        fraction = opts.mem_fraction_static
        if fraction is None:
            fraction = default_mem_fraction_static(memory, chunk, opts.max_prefill_tokens, opts.max_running_requests, opts.tp)
        opts = replace(opts, chunked_prefill_size=chunk, mem_fraction_static=fraction)
    model = _model(opts.model)
    if opts.kv_cache_dtype == "auto" and model is not None and model.is_dsa:
        opts = replace(opts, kv_cache_dtype=default_kv_cache_dtype(True, device_sm_version(opts)))
    if opts.overlap and not opts.disable_radix_cache and model is not None and model.is_hybrid_linear:
        # SGLang's radix cache of a hybrid linear-attention model (mamba_scheduler_strategy "no_buffer",
        # its default) cannot overlap: it turns the overlap schedule off (server_args.py, 0.5.9).
        opts = replace(opts, overlap=False)
    return opts


def _graphs(opts: ReplayOptions) -> CudaGraphPolicy:
    """SGLang's decode graphs on the replay's device: up to its default `--cuda-graph-max-bs` for the
    device memory and TP (512 at TP 4 and more on an H100 or H200, 256 below; 512 on a B200)."""
    memory = device_memory_bytes(opts)
    return sglang_graphs() if memory is None else sglang_graphs(default_cuda_graph_max_bs(memory, opts.tp))


def _model(name: str | None) -> ModelConfig | None:
    """The model's config, None where it does not load (the replay reports that)."""
    from scheduler.model_config import load_model_config

    if name is None:
        return None
    try:
        return load_model_config(name)
    except (OSError, ValueError):  # (ModelConfigError is a ValueError)
        return None


def config(opts: ReplayOptions, model: ModelConfig, kv_tokens: int) -> SchedulerConfig:
    return SchedulerConfig(
        journal_row_writes=opts.mode == "real",
        kv_tokens=kv_tokens,
        context_len=model.context_len,
        policy=opts.policy,
        page_size=opts.page_size,
        max_prefill_tokens=opts.max_prefill_tokens,
        chunked_prefill_size=opts.chunked_prefill_size,
        max_running_requests=opts.max_running_requests,
        disable_radix_cache=opts.disable_radix_cache,
        overlap=opts.overlap,
        seed=opts.seed,
        schedule_conservativeness=opts.schedule_conservativeness,
        enable_mixed_chunk=opts.enable_mixed_chunk,
        enable_priority_scheduling=opts.enable_priority_scheduling,
        priority_scheduling_preemption_threshold=opts.priority_scheduling_preemption_threshold,
        scheduler_recv_interval=opts.scheduler_recv_interval,
    )


SGLANG = SchedulerKind(
    name="sglang",
    label="SGLang",
    policies=tuple(POLICIES),
    own_options=(
        "chunked_prefill_size",
        "max_prefill_tokens",
        "max_running_requests",
        "enable_mixed_chunk",
        "enable_priority_scheduling",
        "priority_scheduling_preemption_threshold",
        "schedule_conservativeness",
        "scheduler_recv_interval",
    ),
    counterparts={
        "max_num_seqs": "use --max-running-requests",
        "max_num_batched_tokens": "use --chunked-prefill-size and --max-prefill-tokens",
    },
    chunk_option="chunked_prefill_size",
    with_defaults=with_defaults,
    config=config,
    new=Scheduler,
    new_prefill=SglangPrefill,
    new_decode=SglangDecode,
    cuda_graphs=lambda opts: _graphs(opts),
)
